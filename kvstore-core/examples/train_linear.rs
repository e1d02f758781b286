//! Data-parallel training through the store: a linear regression on synthetic data,
//! with four `cpu(i)` contexts as workers, as MXNet trained on several devices.
//!
//! Each step, every worker computes the gradient of the squared error on its quarter of
//! a minibatch (on its own copy of the weights), the four gradients are pushed to one key
//! (`push(["w", "w", "w", "w"], grads)`: the store sums them), the store's optimizer (SGD
//! with momentum, `rescale_grad` = 1 / batch size, so the sum becomes the mean) updates
//! the weights, and every worker pulls them back. The loss over the whole data set falls
//! to the noise floor (the noise variance), and the learned weights land next to the true
//! ones. Run with `cargo run --release -p kvstore-core --example train_linear`; the same
//! demo in Clojure is `clojure/examples/train_linear.clj`.

use std::thread;

use kvstore_core::{Context, DType, Error, KVStore, NDArray, Optimizer, Result};

const FEATURES: usize = 8;
/// The weights and the bias, in one key: `[w0 .. w7, b]`.
const PARAMS: usize = FEATURES + 1;
const SAMPLES: usize = 4096;
const BATCH: usize = 256;
const WORKERS: usize = 4;
const EPOCHS: usize = 10;
const NOISE_SD: f64 = 0.1;
const LEARNING_RATE: f64 = 0.05;
const MOMENTUM: f64 = 0.9;

const W_TRUE: [f64; FEATURES] = [1.5, -2.0, 0.7, 3.1, -0.4, 0.0, 2.2, -1.3];
const B_TRUE: f64 = 0.5;

/// SplitMix64 with Box-Muller normals: a fixed seed gives the same data everywhere.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// The data set: `x` row-major, `SAMPLES` × `FEATURES`, and `y = x·w + b + noise`.
struct Data {
    x: Vec<f64>,
    y: Vec<f64>,
}

impl Data {
    fn synthetic(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let x: Vec<f64> = (0..SAMPLES * FEATURES).map(|_| rng.normal()).collect();
        let y = x.chunks_exact(FEATURES).map(|row| predict(row, &W_TRUE, B_TRUE) + NOISE_SD * rng.normal()).collect();
        Data { x, y }
    }

    fn row(&self, i: usize) -> &[f64] {
        &self.x[i * FEATURES..(i + 1) * FEATURES]
    }

    /// The mean squared error of `params` over the whole data set.
    fn loss(&self, params: &[f64]) -> f64 {
        let (w, b) = params.split_at(FEATURES);
        (0..SAMPLES).map(|i| (predict(self.row(i), w, b[0]) - self.y[i]).powi(2)).sum::<f64>() / SAMPLES as f64
    }

    /// The gradient of the squared error summed over the samples `rows`:
    /// `Σ 2 (x·w + b − y) [x, 1]`.
    fn gradient(&self, params: &[f64], rows: std::ops::Range<usize>) -> Vec<f32> {
        let (w, b) = params.split_at(FEATURES);
        let mut g = vec![0.0f64; PARAMS];
        for i in rows {
            let row = self.row(i);
            let err = 2.0 * (predict(row, w, b[0]) - self.y[i]);
            for (gj, xj) in g.iter_mut().zip(row) {
                *gj += err * xj;
            }
            g[FEATURES] += err;
        }
        g.into_iter().map(|v| v as f32).collect()
    }
}

fn predict(row: &[f64], w: &[f64], b: f64) -> f64 {
    row.iter().zip(w).map(|(x, w)| x * w).sum::<f64>() + b
}

fn main() -> Result<()> {
    let data = Data::synthetic(42);
    let contexts: Vec<Context> = (0..WORKERS as u32).map(Context::cpu).collect();
    println!(
        "linear regression: {SAMPLES} samples, {FEATURES} features, noise sd {NOISE_SD} (loss floor {:.4}); \
         {WORKERS} workers on cpu(0..{})",
        NOISE_SD * NOISE_SD,
        WORKERS - 1
    );

    let kv = KVStore::create("local")?;
    kv.init("w", &NDArray::zeros(&[PARAMS])?)?;
    kv.set_optimizer(
        Optimizer::builder("sgd")
            .param("learning_rate", LEARNING_RATE)
            .param("momentum", MOMENTUM)
            .param("rescale_grad", 1.0 / BATCH as f64)
            .build()?,
    )?;
    println!("optimizer: sgd, learning_rate {LEARNING_RATE}, momentum {MOMENTUM}, rescale_grad 1/{BATCH}");

    // Each worker's copy of the weights, and its gradient, on its own context.
    let weights: Vec<NDArray> =
        contexts.iter().map(|&c| NDArray::zeros_with(&[PARAMS], DType::F32, c)).collect::<Result<_>>()?;
    let grads: Vec<NDArray> =
        contexts.iter().map(|&c| NDArray::zeros_with(&[PARAMS], DType::F32, c)).collect::<Result<_>>()?;
    let keys = ["w"; WORKERS];
    let quarter = BATCH / WORKERS;
    println!("epoch {:2}  loss {:.6}", 0, data.loss(&weights[0].to_f64_vec()?));

    for epoch in 1..=EPOCHS {
        for start in (0..SAMPLES).step_by(BATCH) {
            // The workers compute their gradients at the same time, each on its own arrays.
            thread::scope(|s| -> Result<()> {
                let jobs: Vec<_> = (0..WORKERS)
                    .map(|k| {
                        let (data, w, g) = (&data, &weights[k], &grads[k]);
                        let rows = start + k * quarter..start + (k + 1) * quarter;
                        s.spawn(move || -> Result<()> {
                            let grad = data.gradient(&w.to_f64_vec()?, rows);
                            g.with_data_mut(|d: &mut [f32]| d.copy_from_slice(&grad))
                        })
                    })
                    .collect();
                for job in jobs {
                    job.join().map_err(|_| Error::Internal("a worker panicked".into()))??;
                }
                Ok(())
            })?;
            kv.push(&keys, &grads, 0)?;
            kv.pull("w", &weights, 0)?;
        }
        println!("epoch {epoch:2}  loss {:.6}", data.loss(&weights[0].to_f64_vec()?));
    }

    let learned = weights[0].to_f64_vec()?;
    println!("param    learned      true");
    for (j, (l, t)) in learned.iter().zip(W_TRUE.iter().chain([&B_TRUE])).enumerate() {
        let name = if j < FEATURES { format!("w[{j}]") } else { "b".to_string() };
        println!("{name:<6} {l:>9.4} {t:>9.4}");
    }
    Ok(())
}
