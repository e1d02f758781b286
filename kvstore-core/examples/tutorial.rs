//! MXNet's KVStore tutorial (`seeds/python-kvstore-tutorial.txt`), step for step, in
//! Rust. Run with `cargo run --example tutorial` (or `make demo`). `cpu(i)` contexts
//! stand in for the tutorial's GPUs.

use kvstore_core::{Context, DType, KVStore, Key, NDArray, Result};

fn show(what: &str, a: &NDArray) -> Result<()> {
    println!("{what}\n{a}\n");
    Ok(())
}

fn main() -> Result<()> {
    // Initialization: init a key, pull it out.
    let kv = KVStore::create("local")?;
    let shape = [2, 3];
    kv.init(3, &NDArray::ones(&shape)?.mul(2)?)?;
    let a = NDArray::zeros(&shape)?;
    kv.pull(3, &a, 0)?;
    show(">>> kv.init(3, ones*2); kv.pull(3, out=a)", &a)?;

    // Push, aggregation and updater.
    kv.push(3, &NDArray::ones(&shape)?.mul(8)?, 0)?;
    kv.pull(3, &a, 0)?;
    show(">>> kv.push(3, ones*8); kv.pull(3, out=a)", &a)?;

    let devices: Vec<Context> = (0..4).map(Context::cpu).collect();
    let b: Vec<NDArray> = devices.iter().map(|&c| NDArray::ones_with(&shape, DType::F32, c)).collect::<Result<_>>()?;
    kv.push(3, &b, 0)?;
    kv.pull(3, &a, 0)?;
    show(">>> kv.push(3, [ones on cpu(0..3)]); kv.pull(3, out=a)", &a)?;

    kv.pull(3, &b, 0)?;
    show(">>> kv.pull(3, out=b); b[1]", &b[1])?;

    kv.set_updater(|key: &Key, _index: usize, input: &NDArray, stored: &NDArray| -> Result<()> {
        println!("update on key: {key}");
        stored.add_assign(&input.mul(2)?)
    })?;
    kv.pull(3, &a, 0)?;
    show(">>> kv._set_updater(update); kv.pull(3, out=a)", &a)?;
    kv.push(3, &NDArray::ones(&shape)?, 0)?;
    kv.pull(3, &a, 0)?;
    show(">>> kv.push(3, ones); kv.pull(3, out=a)", &a)?;

    // Pull into several devices.
    let b: Vec<NDArray> = devices.iter().map(|&c| NDArray::ones_with(&shape, DType::F32, c)).collect::<Result<_>>()?;
    kv.pull(3, &b, 0)?;
    show(">>> kv.pull(3, out=b); b[1]", &b[1])?;

    // List key-value pairs, one device.
    let keys = [5, 7, 9];
    let ones: Vec<NDArray> = keys.iter().map(|_| NDArray::ones(&shape)).collect::<Result<_>>()?;
    kv.init(&keys, &ones)?;
    kv.push(&keys, &ones, 0)?;
    let b: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros(&shape)).collect::<Result<_>>()?;
    kv.pull(&keys, &b, 0)?;
    show(">>> kv.push(keys, [ones]*3); kv.pull(keys, out=b); b[1]", &b[1])?;

    // List key-value pairs, several devices.
    let b: Vec<Vec<NDArray>> = keys
        .iter()
        .map(|_| devices.iter().map(|&c| NDArray::ones_with(&shape, DType::F32, c)).collect::<Result<_>>())
        .collect::<Result<_>>()?;
    kv.push(&keys, &b, 0)?;
    kv.pull(&keys, &b, 0)?;
    show(">>> kv.push(keys, [[ones on cpu(0..3)]]*3); kv.pull(keys, out=b); b[1][1]", &b[1][1])?;
    Ok(())
}
