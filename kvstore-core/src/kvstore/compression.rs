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

use crate::error::{Error, Result};

/// The store's compression, once set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TwoBit {
    /// The quantum `t` (> 0).
    pub(crate) threshold: f32,
}

/// MXNet's default threshold.
const DEFAULT_THRESHOLD: f32 = 0.5;

/// Parses `set_gradient_compression`'s parameters with MXNet's rules: `type` is required
/// and must be `2bit`; `threshold` (default 0.5) must be a number above 0; other names
/// are ignored.
pub(crate) fn parse(params: &[(&str, &str)]) -> Result<TwoBit> {
    let get = |name: &str| params.iter().rev().find(|(k, _)| k.trim() == name).map(|(_, v)| v.trim());
    let kind = get("type").ok_or_else(|| {
        Error::invalid_argument("gradient compression: the parameter \"type\" is required (\"2bit\")")
    })?;
    if kind != "2bit" {
        return Err(Error::invalid_argument(format!(
            "gradient compression: unknown type {:?}: the type is \"2bit\"",
            crate::key::shorten(kind)
        )));
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
    Ok(TwoBit { threshold })
}

impl TwoBit {
    /// Quantises `grad` with `residual` (updated in place), writing the quantised values
    /// (what the receiver gets back from the codes) into `out`.
    pub(crate) fn quantize(&self, grad: &[f32], residual: &mut [f32], out: &mut [f32]) {
        let t = self.threshold;
        for ((&g, r), o) in grad.iter().zip(residual.iter_mut()).zip(out.iter_mut()) {
            *r += g;
            *o = if *r >= t {
                *r -= t;
                t
            } else if *r <= -t {
                *r += t;
                -t
            } else {
                0.0
            };
        }
    }

    /// The 2-bit codes of quantised values `q` (each +t, −t or 0), 16 to a word.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn pack(&self, q: &[f32]) -> Vec<u32> {
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
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn unpack(&self, words: &[u32], n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let (byte, pair) = ((i % 16) / 4, i % 4);
                match (words[i / 16] >> (byte * 8 + 6 - 2 * pair)) & 0b11 {
                    0b11 => self.threshold,
                    0b10 => -self.threshold,
                    _ => 0.0,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_follow_mxnets_rules() {
        assert_eq!(parse(&[("type", "2bit")]).unwrap().threshold, 0.5);
        assert_eq!(parse(&[("type", "2bit"), ("threshold", "0.25"), ("other", "x")]).unwrap().threshold, 0.25);
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
        let (mut r, mut q) = ([0.0; 3], [0.0; 3]);
        c.quantize(&g, &mut r, &mut q);
        assert_eq!((q, r), ([0.0, 1.0, -1.0], [0.5, 0.5, -1.5]));
        c.quantize(&g, &mut r, &mut q);
        assert_eq!((q, r), ([1.0, 1.0, -1.0], [0.0, 1.0, -3.0]));
    }

    #[test]
    fn codes_are_mxnets_layout_and_round_trip() {
        let c = TwoBit { threshold: 0.5 };
        // Value 0 is the top bit pair of byte 0; value 5 the second pair of byte 1.
        let mut q = vec![0.0f32; 20];
        q[0] = 0.5;
        q[5] = -0.5;
        q[19] = 0.5;
        let words = c.pack(&q);
        assert_eq!(words.len(), 2);
        assert_eq!(words[0], 0b11 << 6 | 0b10 << (8 + 4));
        assert_eq!(words[1], 0b11); // value 19: byte 0 of word 1, pair 3
        assert_eq!(c.unpack(&words, q.len()), q);
    }
}
