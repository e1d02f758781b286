//! Gradient compression, MXNet's `2bit`: each pushed value is quantised to
//! {−threshold, 0, +threshold} with a residual per key and per value position (the
//! device the value came from, in MXNet) that carries what was not sent to the next
//! push. Per element: `r += g`; if `r ≥ t` the value is `+t` and `r −= t`; else if
//! `r ≤ −t` it is `−t` and `r += t`; else it is 0. The store sums the quantised
//! values, then merges the sum as ever (assign, updater, optimizer); `init` and `pull`
//! are not compressed.
//!
//! On the wire (MXNet's layout, for `dist_*`) 16 values share a 32-bit word, 2 bits
//! each (`11` = +t, `10` = −t, `00` = 0): value `i` is in byte `(i % 16) / 4` of its
//! word, bit pair `i % 4` counted from the byte's most significant bits.
//!
//! An extension of this store's, for `dist_*` only: `fp16` and `bf16`, each worker's
//! sums rounded once to 16 bits for the wire (half the bytes) and added up in f32, as
//! Horovod's fp16 compression does but with the sum in f32; no residual. A sum beyond
//! the 16-bit type's range rounds to an infinity of its sign (in fp16 from 65,520 on),
//! inf and NaN stay so, as IEEE rounding does: the same bits reach every worker, and a
//! dynamic loss scaler sees the overflow (docs/compression.md says why not an error).

use rayon::ThreadPool;
use rayon::prelude::*;

use crate::error::{Error, Result};

/// The values per piece of a quantisation or a sum of codes over a thread pool: a
/// multiple of 16 (a piece's codes are whole words).
const PIECE: usize = 1 << 16;

/// The store's compression, once set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Compression {
    TwoBit(TwoBit),
    /// Sums rounded to a 16-bit float on the wire (`dist_*` only).
    Half(Half),
}

/// The 16-bit float a [`Compression::Half`] sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Half {
    F16,
    Bf16,
}

impl Half {
    /// `x` rounded to this type (to nearest, ties to even), as its bits.
    pub(crate) fn round(self, x: f32) -> u16 {
        match self {
            Half::F16 => half::f16::from_f32(x).to_bits(),
            Half::Bf16 => half::bf16::from_f32(x).to_bits(),
        }
    }

    /// The f32 that `bits` of this type stand for (exact).
    pub(crate) fn widen(self, bits: u16) -> f32 {
        match self {
            Half::F16 => half::f16::from_bits(bits).to_f32(),
            Half::Bf16 => half::bf16::from_bits(bits).to_f32(),
        }
    }
}

impl Compression {
    /// How a desync message names it (no parenthesis: it ends a call's form).
    pub(crate) fn describe(&self) -> String {
        match self {
            Compression::TwoBit(c) => format!("2-bit compressed at threshold {}", c.threshold),
            Compression::Half(Half::F16) => "fp16 compressed".to_string(),
            Compression::Half(Half::Bf16) => "bf16 compressed".to_string(),
        }
    }
}

/// MXNet's `2bit` compression.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TwoBit {
    /// The quantum `t` (> 0).
    pub(crate) threshold: f32,
}

/// Where value `i` of a word's 16 sits: byte `i / 4`, bit pair `i % 4` from the byte's
/// most significant bits.
const SHIFTS: [u32; 16] = {
    let mut s = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        s[i] = (i as u32 / 4) * 8 + 6 - 2 * (i as u32 % 4);
        i += 1;
    }
    s
};

/// For each mask of 8 values (bit `i` for value `i`), the 16 bits of their two bytes
/// with the low bit (`LOW`) or the high bit (`HIGH`) of each marked value's pair set:
/// a word's codes are the `HIGH` bits of its values at or past ±t and the `LOW` bits
/// of those at or past +t.
const LOW: [u16; 256] = spread(0);
const HIGH: [u16; 256] = spread(1);

const fn spread(bit: u32) -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut mask = 0;
    while mask < 256 {
        let mut i = 0;
        while i < 8 {
            if (mask >> i) & 1 == 1 {
                table[mask] |= 1 << (SHIFTS[i] + bit);
            }
            i += 1;
        }
        mask += 1;
    }
    table
}

/// The codes of 16 values of a gradient `g` with their residual `r`, as a word, with
/// what is left of each written into `n` ([`quantum`]'s rule). Written without
/// branches, so that the compiler keeps the 16 values in vector registers; the codes
/// come from two 16-bit masks through the [`LOW`] and [`HIGH`] tables (shifting each
/// code into place took 1.5 x as long).
#[inline(always)]
fn word16(t: f32, g: &[f32; 16], r: &[f32; 16], n: &mut [f32; 16]) -> u32 {
    let (mut pos, mut any) = (0u32, 0u32);
    for i in 0..16 {
        let (p, q, left) = quantum(r[i] + g[i], t);
        n[i] = left;
        pos |= u32::from(p) << i;
        any |= u32::from(p | q) << i;
    }
    let half = |table: &[u16; 256], m: u32| {
        u32::from(table[(m & 0xff) as usize]) | u32::from(table[(m >> 8) as usize & 0xff]) << 16
    };
    half(&LOW, pos) | half(&HIGH, any)
}

/// Where `r` (a residual with the new gradient added) falls, and what is left of it:
/// from `t` up it is sent as `+t` (code `11`) and `r - t` is left; from `-t` down as
/// `-t` (code `10`) and `r + t` is left; else as 0 (code `00`) and `r` is left. The
/// first two as flags, so that 16 values' codes are two masks ([`word16`]).
#[inline(always)]
fn quantum(r: f32, t: f32) -> (bool, bool, f32) {
    let (pos, neg) = (r >= t, r <= -t);
    let left = if pos {
        r - t
    } else if neg {
        r + t
    } else {
        r
    };
    (pos, neg, left)
}

/// MXNet's default threshold.
const DEFAULT_THRESHOLD: f32 = 0.5;

/// Parses `set_gradient_compression`'s parameters with MXNet's rules: `type` is required
/// and must be `2bit` (or this store's `fp16` or `bf16`); `threshold` (default 0.5) must
/// be a number above 0; other names are ignored.
pub(crate) fn parse(params: &[(&str, &str)]) -> Result<Compression> {
    let get = |name: &str| params.iter().rev().find(|(k, _)| k.trim() == name).map(|(_, v)| v.trim());
    let kind = get("type").ok_or_else(|| {
        Error::invalid_argument("gradient compression: the parameter \"type\" is required (\"2bit\")")
    })?;
    match kind {
        "2bit" => {}
        "fp16" => return Ok(Compression::Half(Half::F16)),
        "bf16" => return Ok(Compression::Half(Half::Bf16)),
        _ => {
            return Err(Error::invalid_argument(format!(
                "gradient compression: unknown type {:?}: the types are \"2bit\" (MXNet's), and \"fp16\" and \"bf16\" \
                 for dist_sync",
                crate::key::shorten(kind)
            )));
        }
    }
    let threshold = match get("threshold") {
        None => DEFAULT_THRESHOLD,
        Some(v) => v.parse::<f32>().map_err(|_| {
            Error::invalid_argument(format!(
                "gradient compression: threshold {:?} is not a number",
                crate::key::shorten(v)
            ))
        })?,
    };
    if !(threshold > 0.0 && threshold.is_finite()) {
        return Err(Error::invalid_argument(format!(
            "gradient compression: threshold must be greater than 0 (and finite), got {threshold}"
        )));
    }
    Ok(Compression::TwoBit(TwoBit { threshold }))
}

impl TwoBit {
    /// Quantises `grad` with the residual `old` (zeros when empty), writing the residual
    /// left into `new` and the quantised values (what the receiver gets back from the
    /// codes) into `out`.
    pub(crate) fn quantize(&self, grad: &[f32], old: &[f32], new: &mut [f32], out: &mut [f32]) {
        let t = self.threshold;
        let old = old.iter().copied().chain(std::iter::repeat(0.0));
        for (((&g, r), n), o) in grad.iter().zip(old).zip(new.iter_mut()).zip(out.iter_mut()) {
            let (pos, neg, left) = quantum(r + g, t);
            *n = left;
            *o = if pos {
                t
            } else if neg {
                -t
            } else {
                0.0
            };
        }
    }

    /// Quantises `grad` with the residual `old` (zeros when empty) straight into 2-bit
    /// codes, 16 to a word, as little-endian bytes appended to `codes`, writing the
    /// residual left into `new`: what a worker of a `dist_*` store sends. Big values are
    /// quantised in pieces over `pool` (each piece's codes have their own place).
    pub(crate) fn quantize_packed(
        &self,
        grad: &[f32],
        old: &[f32],
        new: &mut [f32],
        codes: &mut Vec<u8>,
        pool: Option<&ThreadPool>,
    ) {
        let start = codes.len();
        codes.resize(start + grad.len().div_ceil(16) * 4, 0);
        let out = &mut codes[start..];
        let piece = |p: usize, g: &[f32], n: &mut [f32], c: &mut [u8]| {
            let at = p * PIECE;
            self.quantize_words(g, old.get(at..at + g.len()).unwrap_or_default(), n, c);
        };
        match pool {
            Some(pool) if grad.len() > PIECE => pool.install(|| {
                grad.par_chunks(PIECE)
                    .zip(new.par_chunks_mut(PIECE))
                    .zip(out.par_chunks_mut(PIECE / 4))
                    .enumerate()
                    .for_each(|(p, ((g, n), c))| piece(p, g, n, c));
            }),
            _ => piece(0, grad, new, out),
        }
    }

    /// [`TwoBit::quantize_packed`] of one piece into its place `codes` (4 bytes for
    /// every 16 values); `old` is the piece's residual, or empty for zeros. A word at a
    /// time ([`word16`]); the last values, fewer than 16, as a word padded with zeros.
    fn quantize_words(&self, grad: &[f32], old: &[f32], new: &mut [f32], codes: &mut [u8]) {
        let t = self.threshold;
        let (g16, g_rest) = grad.as_chunks::<16>();
        let (n16, n_rest) = new.as_chunks_mut::<16>();
        let (c4, _) = codes.as_chunks_mut::<4>();
        let words = g16.iter().zip(n16.iter_mut()).zip(c4.iter_mut());
        let (r16, r_rest) = old.as_chunks::<16>();
        if old.is_empty() {
            for ((g, n), c) in words {
                *c = word16(t, g, &[0.0; 16], n).to_le_bytes();
            }
        } else {
            for (((g, n), c), r) in words.zip(r16) {
                *c = word16(t, g, r, n).to_le_bytes();
            }
        }
        if !g_rest.is_empty() {
            let k = g_rest.len();
            let (mut g, mut r, mut n) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
            g[..k].copy_from_slice(g_rest);
            if !old.is_empty() {
                r[..k].copy_from_slice(r_rest);
            }
            let word = word16(t, &g, &r, &mut n);
            n_rest.copy_from_slice(&n[..k]);
            // (`codes` holds a word for them: a word for every 16 values or fewer.)
            if let Some(c) = c4.get_mut(g16.len()) {
                *c = word.to_le_bytes();
            }
        }
    }

    /// Writes into `out` the sum, in the order of `codes`, of the values that each
    /// worker's little-endian codes stand for (`out.len()` values; each of `codes`
    /// holds `out.len().div_ceil(16)` words): `((v0 + v1) + v2) ...`, one pass over
    /// `out`, a byte's four values at a time from a table of the 256 bytes; big outs in
    /// pieces over `pool`.
    pub(crate) fn sum_codes(&self, codes: &[&[u8]], out: &mut [f32], pool: Option<&ThreadPool>) {
        let t = self.threshold;
        let mut table = [[0.0f32; 4]; 256];
        for (byte, values) in table.iter_mut().enumerate() {
            for (pair, v) in values.iter_mut().enumerate() {
                *v = match (byte >> (6 - 2 * pair)) & 0b11 {
                    0b11 => t,
                    0b10 => -t,
                    _ => 0.0,
                };
            }
        }
        let Some((first, rest)) = codes.split_first() else {
            out.fill(0.0);
            return;
        };
        let piece = |p: usize, out: &mut [f32]| {
            let bytes = p * PIECE / 4..p * PIECE / 4 + out.len().div_ceil(4);
            let (first, rest): (&[u8], Vec<&[u8]>) =
                (&first[bytes.clone()], rest.iter().map(|c| &c[bytes.clone()]).collect());
            let add = |o: &mut [f32; 4], byte: u8| {
                let values = &table[usize::from(byte)];
                for k in 0..4 {
                    o[k] += values[k];
                }
            };
            // 1,024 values at a time, which stay in the first cache while every
            // worker's values are added to them (a byte of every worker at a time took
            // 1.3 x as long for two workers).
            let (quads, tail) = out.as_chunks_mut::<4>();
            for (block, values) in quads.chunks_mut(256).enumerate() {
                let at = block * 256;
                for (o, &b) in values.iter_mut().zip(&first[at..]) {
                    *o = table[usize::from(b)];
                }
                for c in &rest {
                    for (o, &b) in values.iter_mut().zip(&c[at..]) {
                        add(o, b);
                    }
                }
            }
            if !tail.is_empty() {
                let b = quads.len();
                let mut v = table[usize::from(first[b])];
                for c in &rest {
                    add(&mut v, c[b]);
                }
                tail.copy_from_slice(&v[..tail.len()]);
            }
        };
        match pool {
            Some(pool) if out.len() > PIECE => {
                pool.install(|| out.par_chunks_mut(PIECE).enumerate().for_each(|(p, o)| piece(p, o)));
            }
            _ => piece(0, out),
        }
    }
}

/// The compression `params` ask for, if a store of kind `kind` (`grouped`: with a
/// worker group, `dist_sync`) takes it.
pub(super) fn accepted(kind: &str, grouped: bool, params: &[(&str, &str)]) -> Result<Compression> {
    if !kind.contains("device") && !grouped {
        return Err(Error::Unsupported {
            what: format!("gradient compression on a {kind} store"),
            hint: "as in MXNet, it is for device and dist_sync stores (create(\"device\"))".to_string(),
        });
    }
    let compression = parse(params)?;
    if matches!(compression, Compression::Half(_)) && !grouped {
        return Err(Error::Unsupported {
            what: format!("{} gradient compression on a {kind} store", params_type(params)),
            hint: "fp16 and bf16 round what crosses the network: they are for dist_sync stores; a device \
                   store takes MXNet's \"2bit\""
                .to_string(),
        });
    }
    Ok(compression)
}

/// The `type` of gradient-compression parameters, for messages.
fn params_type(params: &[(&str, &str)]) -> String {
    params.iter().rev().find(|(k, _)| k.trim() == "type").map_or(String::new(), |(_, v)| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2-bit codes of quantised values `q` (each +t, −t or 0), 16 to a word, by
    /// MXNet's layout written out element by element: what the packing quantiser must give.
    fn pack(q: &[f32]) -> Vec<u32> {
        let mut words = vec![0u32; q.len().div_ceil(16)];
        for (i, &v) in q.iter().enumerate() {
            let code: u32 = if v > 0.0 {
                0b11
            } else if v < 0.0 {
                0b10
            } else {
                continue;
            };
            let (byte, pair) = ((i % 16) / 4, i % 4);
            words[i / 16] |= code << (byte * 8 + 6 - 2 * pair);
        }
        words
    }

    /// The `n` values that codes `words` stand for.
    fn unpack(c: &TwoBit, words: &[u32], n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let (byte, pair) = ((i % 16) / 4, i % 4);
                match (words[i / 16] >> (byte * 8 + 6 - 2 * pair)) & 0b11 {
                    0b11 => c.threshold,
                    0b10 => -c.threshold,
                    _ => 0.0,
                }
            })
            .collect()
    }

    #[test]
    fn parameters_follow_mxnets_rules() {
        let two = |t| Compression::TwoBit(TwoBit { threshold: t });
        assert_eq!(parse(&[("type", "2bit")]).unwrap(), two(0.5));
        assert_eq!(parse(&[("type", "2bit"), ("threshold", "0.25"), ("other", "x")]).unwrap(), two(0.25));
        assert_eq!(parse(&[("type", "fp16"), ("threshold", "-1")]).unwrap(), Compression::Half(Half::F16));
        assert_eq!(parse(&[("type", "bf16")]).unwrap(), Compression::Half(Half::Bf16));
        for (params, says) in [
            (&[("threshold", "0.5")][..], "\"type\" is required"),
            (&[("type", "3bit")][..], "unknown type"),
            (&[("type", "2bit"), ("threshold", "0")][..], "greater than 0"),
            (&[("type", "2bit"), ("threshold", "-1")][..], "greater than 0"),
            (&[("type", "2bit"), ("threshold", "inf")][..], "greater than 0"),
            (&[("type", "2bit"), ("threshold", "half")][..], "not a number"),
        ] {
            let e = parse(params).unwrap_err();
            assert!(e.to_string().contains(says), "{params:?}: {e}");
        }
    }

    #[test]
    fn quantising_carries_the_residual_to_the_next_push() {
        // The reference's example: t = 1, [0.5, 1.5, -2.5] twice gives [0, 1, -1], then [1, 1, -1].
        let c = TwoBit { threshold: 1.0 };
        let g = [0.5, 1.5, -2.5];
        let (mut r, mut r2, mut q) = ([0.0; 3], [0.0; 3], [0.0; 3]);
        c.quantize(&g, &[], &mut r, &mut q);
        assert_eq!((q, r), ([0.0, 1.0, -1.0], [0.5, 0.5, -1.5]));
        c.quantize(&g, &r, &mut r2, &mut q);
        assert_eq!((q, r2), ([1.0, 1.0, -1.0], [0.0, 1.0, -3.0]));
    }

    #[test]
    fn codes_are_mxnets_layout_and_round_trip() {
        let c = TwoBit { threshold: 0.5 };
        // Value 0 is the top bit pair of byte 0; value 5 the second pair of byte 1.
        let mut q = vec![0.0f32; 20];
        q[0] = 0.5;
        q[5] = -0.5;
        q[19] = 0.5;
        let words = pack(&q);
        assert_eq!(words.len(), 2);
        assert_eq!(words[0], 0b11 << 6 | 0b10 << (8 + 4));
        assert_eq!(words[1], 0b11); // value 19: byte 0 of word 1, pair 3
        assert_eq!(unpack(&c, &words, q.len()), q);
    }

    #[test]
    fn packed_quantising_sends_what_quantising_gives() {
        let c = TwoBit { threshold: 0.3 };
        let g: Vec<f32> = (0..37).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.11).collect();
        let (mut r1, mut r2, mut q) = (vec![0.05f32; 37], vec![0.05f32; 37], vec![0.0; 37]);
        for _ in 0..3 {
            let (old1, old2) = (r1.clone(), r2.clone());
            c.quantize(&g, &old1, &mut r1, &mut q);
            let mut codes = vec![9u8];
            c.quantize_packed(&g, &old2, &mut r2, &mut codes, None);
            assert_eq!(codes.len(), 1 + 37usize.div_ceil(16) * 4);
            let codes = &codes[1..];
            let words: Vec<u32> = codes.chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
            assert_eq!(words, pack(&q));
            let mut sum = vec![1.0f32; 37];
            c.sum_codes(&[codes], &mut sum, None);
            assert_eq!(sum, q);
            c.sum_codes(&[codes, codes, codes], &mut sum, None);
            assert_eq!(sum, q.iter().map(|x| x + x + x).collect::<Vec<f32>>());
            assert_eq!(r1, r2);
        }
    }

    /// Values of several pieces, quantised and summed over a pool, give the bits of one
    /// piece on one thread: the same codes, residuals and sums, in rank order.
    #[test]
    fn pieces_over_a_pool_give_the_bits_of_one_thread() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let c = TwoBit { threshold: 0.4 };
        let n = 3 * PIECE + 21;
        let g: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 600.0).collect();
        for old in [vec![], (0..n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect::<Vec<f32>>()] {
            let (mut one, mut many) = (vec![0.0f32; n], vec![0.0f32; n]);
            let (mut c1, mut c2) = (Vec::new(), Vec::new());
            c.quantize_packed(&g, &old, &mut one, &mut c1, None);
            c.quantize_packed(&g, &old, &mut many, &mut c2, Some(&pool));
            assert!(c1 == c2 && one.iter().map(|x| x.to_bits()).eq(many.iter().map(|x| x.to_bits())));
            let mut other = Vec::new();
            c.quantize_packed(&old.iter().map(|x| -x).collect::<Vec<_>>(), &[], &mut vec![0.0; n], &mut other, None);
            let other = if old.is_empty() { c1.clone() } else { other };
            let (mut s1, mut s2) = (vec![0.0f32; n], vec![7.0f32; n]);
            c.sum_codes(&[&c1, &other, &c1], &mut s1, None);
            c.sum_codes(&[&c1, &other, &c1], &mut s2, Some(&pool));
            assert!(s1.iter().map(|x| x.to_bits()).eq(s2.iter().map(|x| x.to_bits())));
            let want: Vec<f32> = unpack(&c, &words(&c1), n)
                .iter()
                .zip(unpack(&c, &words(&other), n))
                .map(|(a, b)| (a + b) + a)
                .collect();
            assert_eq!(s1, want);
        }
    }

    fn words(codes: &[u8]) -> Vec<u32> {
        codes.chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect()
    }
}
