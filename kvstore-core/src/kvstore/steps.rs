//! Desync detection: before the data of a `dist_sync` call moves, the workers compare
//! what they are calling. Each call that communicates (push, pushpull, init, broadcast,
//! barrier, checkpoints) is a numbered step of its store; every worker sends the others
//! a fingerprint of its step (the number, the operation, every key with its shape and
//! dtype, and whether its own checks refused the call). When the fingerprints differ,
//! the workers exchange readable descriptions and every worker fails the call with the
//! same message, saying what each worker called, instead of hanging in a collective of
//! another size or summing different keys together. A worker whose own checks refused
//! the call returns its own error; the others say which worker refused.

use std::sync::atomic::Ordering;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;

use super::agree::{Said, by_value, padded, ranks};
use super::compression::Compression;
use super::data::Store;
use super::layout::Layout;
use super::stats::Phase;
use crate::timeline::{self, Arg};

/// One key of a step: its name, and the shape and dtype of what the call gives for it.
pub(super) type StepKey<'a> = (&'a Key, &'a [usize], DType);

/// The keys named in a description; the rest are counted.
const SHOWN_KEYS: usize = 3;

/// What a call does, in the words of the desync message (`rank 0 pushed "w" [2] f32`).
fn verb(op: &str) -> &str {
    match op {
        "push" => "pushed",
        "push_row_sparse" => "pushed rows of",
        "pushpull" => "pushpulled",
        "init" => "initialised",
        "broadcast" => "broadcast",
        "barrier" => "waited at a barrier",
        "save_checkpoint" => "saved a checkpoint",
        "load_checkpoint" => "loaded a checkpoint",
        other => other,
    }
}

/// The fingerprint record: the step number, a 64-bit hash of the call, and whether
/// the call was refused here.
///
/// The call is written out once (each part preceded by its length, so that no two
/// calls write the same bytes) and hashed in bulk: a list call of a thousand keys costs
/// a few microseconds, not one hasher update per field. The two halves of the hash are
/// CRC-32s of the bytes in two different orders, which no difference a desynced call
/// makes passes both of but with odds of about 2^-64.
fn fingerprint(op: &str, seq: u64, keys: &[StepKey<'_>], refused: bool) -> [u8; 17] {
    let mut call =
        Vec::with_capacity(16 + keys.iter().map(|(k, s, _)| 32 + k.as_str().len() + 8 * s.len()).sum::<usize>());
    let word = |call: &mut Vec<u8>, n: usize| call.extend_from_slice(&(n as u64).to_le_bytes());
    let put = |call: &mut Vec<u8>, b: &[u8]| {
        word(call, b.len());
        call.extend_from_slice(b);
    };
    put(&mut call, op.as_bytes());
    for (key, shape, dtype) in keys {
        put(&mut call, key.as_str().as_bytes());
        put(&mut call, dtype.name().as_bytes());
        word(&mut call, shape.len());
        for &d in *shape {
            word(&mut call, d);
        }
    }
    let (front, back) = call.split_at(call.len() / 2);
    let mut h2 = crc32fast::Hasher::new_with_initial(0x9e37_79b9);
    h2.update(back);
    h2.update(front);
    let hash = (u64::from(crc32fast::hash(&call)) << 32) | u64::from(h2.finalize());
    let mut record = [0u8; 17];
    record[..8].copy_from_slice(&seq.to_le_bytes());
    record[8..16].copy_from_slice(&hash.to_le_bytes());
    record[16] = u8::from(refused);
    record
}

/// A step as the desync message shows it: `pushed "fc1.weight" [512, 256] f32`, then
/// ` (form)` (which [`Store::check_calls`] keeps only where the workers' forms differ).
fn describe(op: &str, keys: &[StepKey<'_>], refused: Option<&Error>, form: &str) -> String {
    let mut s = verb(op).to_string();
    for (i, (key, shape, dtype)) in keys.iter().take(SHOWN_KEYS).enumerate() {
        let shape = shape.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
        s += &format!("{} \"{key}\" [{shape}] {dtype}", if i == 0 { "" } else { "," });
    }
    if keys.len() > SHOWN_KEYS {
        s += &format!(" and {} more keys", keys.len() - SHOWN_KEYS);
    }
    if let Some(e) = refused {
        s += &format!(", which it refused ({e})");
    }
    // A record has room for a long key or message, shortened (on a char boundary),
    // and the form.
    let limit = crate::backend::MAX_RECORD - 4 - form.len() - 3;
    if s.len() > limit {
        let cut = (0..=limit - 3).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        s.truncate(cut);
        s += "…";
    }
    s + " (" + form + ")"
}

/// Where a step's record says how many calls the step holds (after the fingerprint's
/// 17 bytes and the refused calls' mask).
const COUNT_AT: usize = 25;

/// What a step's record says besides its calls: the store's step number and how it
/// moves the pushes' data.
struct Call<'a> {
    op: &'static str,
    seq: u64,
    compression: Option<Compression>,
    merged: &'a str,
    /// How a `dist_sync` store lays out its optimizer state (`layout.rs`), said where it
    /// is not the default (owners, split at MXNet's bound): workers with owners and
    /// workers without, or that split keys at other bounds, would move other data.
    layout: String,
}

/// A step's calls (operation and number of keys each), their keys, and this worker's
/// checks of each.
type Calls<'c, 'k> = (&'c [(&'static str, usize)], &'c [StepKey<'k>], Vec<Result<()>>);

impl Call<'_> {
    /// The step's form (`non-blocking, 2-bit compression …`) and what it calls
    /// (`push`, or `3 fused calls (push of 1, …)`).
    fn form_and_what(&self, calls: &[(&'static str, usize)]) -> (String, String) {
        // A batch's record names each call and its size, so that where one call ends and
        // the next begins is part of the fingerprint.
        let what = match calls {
            [(one, _)] => (*one).to_string(),
            _ => {
                let each: Vec<String> = calls.iter().map(|(op, n)| format!("{op} of {n}")).collect();
                format!("{} fused calls ({})", calls.len(), each.join(", "))
            }
        };
        let form = if crate::engine::in_background() { "non-blocking" } else { "blocking" };
        // Workers that compress their pushes and workers that do not would move other
        // data: part of the form, so that they fail at once instead.
        let pushes = calls.iter().any(|(op, _)| op.contains("push"));
        let compressed = match self.compression {
            Some(c) if pushes => format!(", {}", c.describe()),
            _ => String::new(),
        };
        let merged = if pushes { self.merged } else { "" };
        // (No parentheses: a form is the last parenthesis of a step's text.)
        let layout = if pushes { self.layout.as_str() } else { "" };
        (format!("{form}{compressed}{merged}{layout}"), what)
    }

    /// This worker's record of a step: the fingerprint, the mask of the calls it
    /// refused (a batch holds at most 64 calls), and the number of calls.
    fn record(&self, calls: &[(&'static str, usize)], keys: &[StepKey<'_>], local: &[Result<()>]) -> Vec<u8> {
        let refused_here =
            local.iter().enumerate().filter(|(_, r)| r.is_err()).fold(0u64, |m, (i, _)| m | 1 << (i % 64));
        let (form, what) = self.form_and_what(calls);
        let mut mine = fingerprint(&format!("{form} {what}"), self.seq, keys, refused_here != 0).to_vec();
        mine.extend_from_slice(&refused_here.to_le_bytes());
        mine.extend_from_slice(&(calls.len() as u64).to_le_bytes());
        mine
    }

    /// The outcome of a step whose records (`all`, this worker's `mine`) hold as many
    /// calls on every worker: see [`Store::check_calls`].
    fn compare(
        &self,
        group: &dyn crate::backend::Collective,
        step: &str,
        (calls, keys, mut local): Calls<'_, '_>,
        mine: &[u8],
        said: &Said,
        all: &[&[u8]],
    ) -> Result<Vec<Result<()>>> {
        let (op, seq) = (self.op, self.seq);
        let same_calls = all.iter().all(|r| r.get(..16) == mine.get(..16));
        // (The refused calls' mask follows the 17 bytes of the fingerprint.)
        let refused_by = |i: usize| said.with_bit(17, 1 << (i % 64));
        if same_calls && calls.len() > 1 {
            for (i, r) in local.iter_mut().enumerate() {
                let by = refused_by(i);
                if r.is_ok() && !by.is_empty() {
                    *r = Err(Error::invalid_argument(format!(
                        "{op} #{seq}: {} refused call {} of {} fused calls; every worker fails that call and none \
                         changed anything for it",
                        ranks(&by),
                        i + 1,
                        calls.len()
                    )));
                }
            }
            return Ok(local);
        }
        // The same call, refused by no worker: every record is this one.
        if local.iter().all(Result::is_ok) && all.iter().all(|r| *r == mine) {
            return Ok(local);
        }
        let local = local.into_iter().find(Result::is_err).unwrap_or(Ok(()));
        // Every worker sees the same records, so every worker takes this path: the
        // descriptions are exchanged, and every worker builds the same message.
        let (form, what) = self.form_and_what(calls);
        let text = describe(&what, keys, local.as_ref().err(), &form);
        let described = Said::exchange(group, step, &padded(&text, crate::backend::MAX_RECORD))?;
        let texts: Vec<String> = (0..described.len()).map(|r| described.text(r, 0)).collect();
        // Each text ends with its call's form; said only where the forms differ.
        let forms: Vec<&str> = texts.iter().map(|t| t.rsplit_once(" (").map_or("", |(_, f)| f)).collect();
        let texts: Vec<String> = match forms.iter().all(|f| *f == forms[0]) {
            true => texts.iter().map(|t| t.rsplit_once(" (").map_or(t.as_str(), |(t, _)| t).to_string()).collect(),
            false => texts,
        };
        local?;
        let refused = said.ranks_where(|r| r.get(16) == Some(&1));
        let groups = by_value(all.iter().zip(&texts).map(|(record, text)| (&record[..16.min(record.len())], text)));
        let said: Vec<String> = groups
            .iter()
            .map(|((call, text), list)| {
                let theirs = call.get(..8).and_then(|b| b.try_into().ok()).map_or(seq, u64::from_le_bytes);
                let number = if theirs == seq { String::new() } else { format!(" as its call #{theirs}") };
                format!("{} {text}{number}", ranks(list))
            })
            .collect();
        // The same call, refused by some: the others made the same call, at the same
        // step (a worker refused before its call was looked at, `Values::Refused`, says
        // no keys: its record is the step's alone).
        let made: Vec<Option<&[u8]>> =
            (0..all.len()).filter(|r| !refused.contains(r)).map(|r| all[r].get(..16)).collect();
        let same_calls = all.iter().all(|r| r.get(..8) == all[0].get(..8)) && made.iter().all(|m| *m == made[0]);
        let refusal = same_calls && !refused.is_empty();
        let what = match refusal {
            true => format!("{} refused the call", ranks(&refused)),
            false => "the workers' calls differ".to_string(),
        };
        // A desync across processes: each writes its last events and says where.
        let flight = match !refusal && timeline::ranks() > 1 {
            true => timeline::flight_note(false),
            false => String::new(),
        };
        Err(Error::invalid_argument(format!(
            "{op} #{seq}: {what}: {}; every worker fails this call and none changed anything{flight}",
            said.join("; ")
        )))
    }
}

impl Store {
    /// Under `dist_sync`, checks that every worker makes this call (see the module's
    /// docs): `keys` are the call's keys in index order with what it gives for each, and
    /// `local` the outcome of this worker's own checks. Elsewhere returns `local`.
    ///
    /// # Errors
    /// `local`'s error on a worker whose checks refused the call;
    /// [`Error::InvalidArgument`] on the others, naming each worker's call, when the
    /// workers' calls differ or one refused it; the group's error if it is broken.
    pub(super) fn check_step(&self, op: &'static str, keys: &[StepKey<'_>], local: Result<()>) -> Result<()> {
        self.check_push_step(op, keys, local, None, "")
    }

    /// [`Store::check_step`] for a push that moves its data with `compression` (part of
    /// the fingerprint: workers that compress differently would move other data), and
    /// merges it as `merged` says ([`super::data::Merger::identity`], part of it too: workers
    /// with other optimizers would part, and the workers of a push with an updater
    /// exchange its outcome, `merge.rs`).
    pub(super) fn check_push_step(
        &self,
        op: &'static str,
        keys: &[StepKey<'_>],
        local: Result<()>,
        compression: Option<Compression>,
        merged: &str,
    ) -> Result<()> {
        self.check_calls(op, &[(op, keys.len())], keys, vec![local], compression, merged)?.pop().unwrap_or(Ok(()))
    }

    /// [`Store::check_step`] for several calls that move their data together (non-blocking
    /// calls fused across calls, `kvstore/run/fused.rs`), as one step: `calls[i]` is call
    /// `i`'s operation and how many of `keys` (in order) are its, and `local[i]` is the
    /// outcome of this worker's checks of it.
    ///
    /// A step holds as many calls on every worker: where another worker's step holds
    /// fewer (it waited for a call where this one did not, its calls used an array
    /// twice, it refused its next call before it was looked up), every worker's step is
    /// its first that many calls, compared again, and the results are theirs alone: the
    /// caller makes the rest as its next step. The workers then make the same steps
    /// whenever they make the same calls, however their batches were cut.
    ///
    /// When the workers made the same calls, each call refused by some worker fails on
    /// every worker (with its own error where it was refused) and the others go on:
    /// the inner results. When the workers' calls differ, every call fails: the outer
    /// error (or its own error, where refused); in a step cut to fewer calls, as the
    /// inner result of each.
    ///
    /// Whether the calls are non-blocking is part of the fingerprint: MPI never matches
    /// a non-blocking collective with a blocking one, so a worker that makes a call
    /// blocking where another makes it non-blocking would wait for ever; instead both
    /// fail the call, saying so.
    ///
    /// # Errors
    /// The outer error as above; the group's error if it is broken.
    pub(super) fn check_calls(
        &self,
        op: &'static str,
        calls: &[(&'static str, usize)],
        keys: &[StepKey<'_>],
        mut local: Vec<Result<()>>,
        compression: Option<Compression>,
        merged: &str,
    ) -> Result<Vec<Result<()>>> {
        let Some(group) = self.collective.as_ref().filter(|_| self.compare_calls) else { return Ok(local) };
        let seq = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        let step = format!("{op} #{seq}");
        let layout = match self.layout {
            Layout::Owners if self.bound == crate::settings::DEFAULT_BIGARRAY_BOUND => String::new(),
            Layout::Owners => format!(", keys split from {} elements", self.bound),
            Layout::Replicated if self.kind == "dist_sync" => ", state replicated".to_string(),
            Layout::Replicated => String::new(),
        };
        let call = Call { op, seq, compression, merged, layout };
        let mut mine = call.record(calls, keys, &local);
        // This worker's arrival, on rank 0's clock, rides along (`stats.rs`): not part
        // of what the workers compare.
        let compared = mine.len();
        let arrived = timeline::now();
        mine.extend_from_slice(&timeline::align(arrived).to_le_bytes());
        let waiting = self.counters.phase(Phase::Ranks).with(|| vec![("step", Arg::U(seq))]);
        let said = Said::exchange(&**group, &step, &mine)?;
        drop(waiting);
        let at: Vec<u64> = (0..said.len()).map(|r| said.word(r, compared)).collect();
        let arrived_at = self.counters.arrivals(&at);
        if timeline::recording() {
            let me = group.rank();
            let args = vec![
                ("step", Arg::U(seq)),
                ("op", Arg::S(op.into())),
                ("late_ms", Arg::F(arrived_at.late_ns.get(me).copied().unwrap_or(0) as f64 / 1e6)),
                ("last", Arg::U(u64::from(arrived_at.last == Some(me)))),
            ];
            timeline::instant("arrive", "collective", arrived, args);
        }
        let counts: Vec<u64> = (0..said.len()).map(|r| said.word(r, COUNT_AT)).collect();
        let fewest = counts.iter().copied().min().unwrap_or(0) as usize;
        if counts.iter().all(|&n| n as usize == calls.len()) || fewest == 0 {
            let all: Vec<&[u8]> = said.records().map(|r| r.get(..compared).unwrap_or(r)).collect();
            return call.compare(&**group, &step, (calls, keys, local), &mine[..compared], &said, &all);
        }
        // Every worker saw the same counts: each cuts its step to the fewest calls and
        // says it again.
        let calls = &calls[..fewest];
        let keys = &keys[..calls.iter().map(|(_, n)| n).sum::<usize>()];
        local.truncate(fewest);
        let mine = call.record(calls, keys, &local);
        let said = Said::exchange(&**group, &step, &mine)?;
        let all: Vec<&[u8]> = said.records().collect();
        match call.compare(&**group, &step, (calls, keys, local), &mine, &said, &all) {
            Err(e) => Ok(vec![Err(e); fewest]),
            results => results,
        }
    }

    /// Waits for every worker (a step of its own: the workers compare their calls).
    pub(super) fn barrier(&self) -> Result<()> {
        self.check_step("barrier", &[], Ok(()))?;
        self.collective.as_ref().map_or(Ok(()), |c| c.barrier())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every part of a call changes its fingerprint: a change of any one of them is a
    /// desync the workers must see (the bytes differing where a key ends and the next
    /// begins included).
    #[test]
    fn every_part_of_a_call_changes_its_fingerprint() {
        // "a" + "bc", "abc" + "b" and "b" + "c": the same letters, cut in other places.
        let (a, bc, abc, b, c) = (Key::from("a"), Key::from("bc"), Key::from("abc"), Key::from("b"), Key::from("c"));
        let f = fingerprint;
        let base = f("push", 7, &[(&a, &[2, 3], DType::F32), (&bc, &[4], DType::F64)], false);
        let others = [
            f("pushpull", 7, &[(&a, &[2, 3], DType::F32), (&bc, &[4], DType::F64)], false),
            f("push", 8, &[(&a, &[2, 3], DType::F32), (&bc, &[4], DType::F64)], false),
            f("push", 7, &[(&a, &[2, 3], DType::F32), (&bc, &[4], DType::F64)], true),
            f("push", 7, &[(&bc, &[2, 3], DType::F32), (&a, &[4], DType::F64)], false),
            f("push", 7, &[(&a, &[3, 2], DType::F32), (&bc, &[4], DType::F64)], false),
            f("push", 7, &[(&a, &[6], DType::F32), (&bc, &[4], DType::F64)], false),
            f("push", 7, &[(&a, &[2, 3, 1], DType::F32), (&bc, &[4], DType::F64)], false),
            f("push", 7, &[(&a, &[2, 3], DType::F16), (&bc, &[4], DType::F64)], false),
            f("push", 7, &[(&a, &[2, 3], DType::F32)], false),
            f("push", 7, &[(&a, &[2, 3], DType::F32), (&bc, &[4], DType::F64), (&c, &[1], DType::U8)], false),
            f("push", 7, &[(&abc, &[2, 3], DType::F32), (&b, &[4], DType::F64)], false),
            f("push", 7, &[(&b, &[2, 3], DType::F32), (&c, &[4], DType::F64)], false),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(base, *other, "change {i} kept the call's record");
        }
        // Two records of the same call are equal (what lets the workers agree).
        assert_eq!(base, f("push", 7, &[(&a, &[2, 3], DType::F32), (&bc, &[4], DType::F64)], false));
    }
}
