//! Row-sparse tables whose rows live on their owners (`kvstore/rows.rs`): every rank
//! holds its rows only, and pulls the bits of the replicated layout and of a `local`
//! store given every worker's pushes in rank order.

use std::sync::Arc;

use kvstore_core::backend::Collective;
use kvstore_core::{DType, ErrorKind, KVStore, Layout, Optimizer, RowSparse};
use kvstore_tests::{ThreadMember, bits, pseudo, run_members};

const BOUND: usize = 1000;

/// The tables of the run: split across the workers at rows (60 x 17 = 1020 elements,
/// over the bound), owned whole (10 x 3), and one of f64.
const TABLES: [(&str, [usize; 2], DType); 3] =
    [("emb", [60, 17], DType::F32), ("small", [10, 3], DType::F32), ("wide", [40, 30], DType::F64)];

fn builder(member: &Arc<ThreadMember>, layout: Layout) -> kvstore_core::KVStoreBuilder {
    let group: Arc<dyn Collective> = Arc::clone(member) as _;
    KVStore::builder("dist_sync").num_threads(1).collective(group).layout(layout).bigarray_bound(BOUND)
}

fn on_owners(member: &Arc<ThreadMember>) -> KVStore {
    builder(member, Layout::Owners).build().expect("dist_sync")
}

fn replicated(member: &Arc<ThreadMember>) -> KVStore {
    builder(member, Layout::Replicated).build().expect("dist_sync")
}

/// Worker `rank`'s gradient of table `t` at `step`: a few rows, none at times,
/// unsorted and repeated ids given as MXNet takes them (here: sorted, distinct).
fn grad(t: usize, step: u64, rank: usize) -> RowSparse {
    let (_, shape, dtype) = TABLES[t];
    let mut rows: Vec<i64> = (0..(step % 6) as i64 * 2)
        .map(|r| (r * 7 + step as i64 * 11 + rank as i64 * 5 + t as i64) % shape[0] as i64)
        .collect();
    rows.sort_unstable();
    rows.dedup();
    let data = pseudo(&[rows.len(), shape[1]], dtype, (step << 12) ^ ((rank as u64) << 4) ^ t as u64);
    RowSparse::new(data, rows, &shape).expect("a row-sparse gradient")
}

/// The optimizers that update a row-sparse gradient's rows alone (lazily), and
/// RMSProp, which updates the whole table (the owners each their rows).
fn optimizer(name: &str) -> Option<Optimizer> {
    if name == "assign" {
        return None;
    }
    let mut b = Optimizer::builder(name).param("learning_rate", 0.05).param("wd", 0.01).param("clip_gradient", 0.8);
    if name == "sgd" {
        b = b.param("momentum", 0.9);
    }
    Some(b.build().expect("an optimizer"))
}

/// Every lazy optimizer, RMSProp and no optimizer at all (assign), 200 steps at 2, 3
/// and 4 workers: the store with rows on owners, the replicated one and a `local` store
/// pushed every worker's gradients in rank order pull the same bits, by row_sparse_pull
/// (each worker its own rows) after every step and by a dense pull every 25 steps.
#[test]
fn tables_on_owners_pull_the_bits_of_the_replicated_and_local_stores() {
    for workers in [2, 3, 4] {
        let outcomes = run_members(workers, move |rank, member| {
            for name in ["sgd", "adam", "adagrad", "ftrl", "rmsprop", "assign"] {
                let kvs = [on_owners(&member), replicated(&member), KVStore::create("local").expect("local")];
                for kv in &kvs {
                    for (t, (k, shape, dtype)) in TABLES.iter().enumerate() {
                        let init = RowSparse::from_dense(&pseudo(shape, *dtype, 40 + t as u64)).expect("rows");
                        kv.init_row_sparse(*k, &init).expect("init");
                    }
                    if let Some(opt) = optimizer(name) {
                        kv.set_optimizer(opt).expect("set");
                    }
                }
                for step in 0..200u64 {
                    for (t, (k, shape, _)) in TABLES.iter().enumerate() {
                        kvs[0].push_row_sparse(*k, &[grad(t, step, rank)], 0).expect("push on owners");
                        kvs[1].push_row_sparse(*k, &[grad(t, step, rank)], 0).expect("push replicated");
                        let all: Vec<RowSparse> = (0..workers).map(|r| grad(t, step, r)).collect();
                        kvs[2].push_row_sparse(*k, &all, 0).expect("push local");
                        let ids: Vec<i64> =
                            (0..7).map(|i| ((i * 13 + step * 3 + rank as u64) % shape[0] as u64) as i64).collect();
                        let got: Vec<(Vec<i64>, Vec<u64>)> = kvs
                            .iter()
                            .map(|kv| {
                                let r = kv.row_sparse_pull(*k, &ids, 0).expect("row_sparse_pull");
                                (r.indices().to_vec(), bits(r.data()))
                            })
                            .collect();
                        if got[0] != got[1] || got[0] != got[2] {
                            return Err(format!("{name}: table {k} after step {step}: rows differ on rank {rank}"));
                        }
                        if step % 25 == 24 {
                            let dense: Vec<Vec<u64>> =
                                kvs.iter().map(|kv| bits(&kv.pull_new(*k, 0).expect("pull"))).collect();
                            if dense[0] != dense[1] || dense[0] != dense[2] {
                                return Err(format!(
                                    "{name}: table {k} after step {step}: pulls differ on rank {rank}"
                                ));
                            }
                        }
                    }
                }
            }
            Ok(())
        });
        for outcome in outcomes {
            outcome.unwrap_or_else(|e| panic!("{workers} workers: {e}"));
        }
    }
}

/// What a rank holds of a table on owners: its rows' values and state only (Adam: two
/// states), where the replicated layout holds the whole table and its state on every
/// rank.
#[test]
fn a_rank_holds_its_rows_of_a_table_and_their_state() {
    let held = run_members(4, |rank, member| {
        [on_owners(&member), replicated(&member)].map(|kv| {
            kv.init_row_sparse("emb", &RowSparse::zeros(&[1000, 8], DType::F32).expect("rows")).expect("init");
            kv.set_optimizer(Optimizer::builder("adam").build().expect("adam")).expect("set");
            let g = RowSparse::new(pseudo(&[2, 8], DType::F32, rank as u64), vec![3, 700], &[1000, 8]).expect("g");
            kv.push_row_sparse("emb", &[g], 0).expect("push");
            kv.stats().held
        })
    });
    let table = 1000 * 8 * 4;
    for (rank, [owned, whole]) in held.iter().enumerate() {
        assert_eq!((owned.values, owned.state), (table / 4, 2 * table / 4), "rank {rank}");
        assert_eq!((whole.values, whole.state), (table, 2 * table), "rank {rank}");
    }
}

/// A dense push into a table on owners is refused on every worker, naming the way to
/// push it, and the table keeps its rows; pushes the rule cannot take split (a custom
/// updater, LAMB) are refused before any rank changes.
#[test]
fn a_dense_push_into_a_table_on_owners_is_refused_on_every_worker() {
    let out = run_members(2, |rank, member| {
        let kv = on_owners(&member);
        let init = RowSparse::from_dense(&pseudo(&[60, 17], DType::F32, 1)).expect("rows");
        kv.init_row_sparse("emb", &init).expect("init");
        let dense = kv.push("emb", &pseudo(&[60, 17], DType::F32, 2 + rank as u64), 0).expect_err("dense");
        kv.set_optimizer(Optimizer::builder("lamb").build().expect("lamb")).expect("set");
        let g = RowSparse::new(pseudo(&[1, 17], DType::F32, 3), vec![5], &[60, 17]).expect("g");
        let lamb = kv.push_row_sparse("emb", &[g], 0).expect_err("lamb");
        (dense, lamb, bits(&kv.pull_new("emb", 0).expect("pull")))
    });
    let want = bits(&pseudo(&[60, 17], DType::F32, 1));
    for (rank, (dense, lamb, after)) in out.iter().enumerate() {
        assert_eq!(dense.kind(), ErrorKind::Unsupported, "rank {rank}: {dense}");
        assert!(dense.to_string().contains("push_row_sparse"), "rank {rank}: {dense}");
        assert!(lamb.to_string().contains("optimizer lamb"), "rank {rank}: {lamb}");
        assert_eq!(after, &want, "rank {rank}: a refused push changed the table");
    }
}

/// A row id out of range on one worker fails the pull on every worker (no worker
/// waits for the others' answers); a worker may ask for no row.
#[test]
fn a_bad_row_id_on_one_worker_fails_the_pull_on_every_worker() {
    let out = run_members(3, |rank, member| {
        let kv = on_owners(&member);
        kv.init_row_sparse("emb", &RowSparse::zeros(&[60, 17], DType::F32).expect("rows")).expect("init");
        let ids = if rank == 1 { vec![3, 60] } else { vec![3] };
        let failed = kv.row_sparse_pull("emb", &ids, 0).map(|_| ()).expect_err("a bad id");
        // The next pull works on every worker, one of which asks for no row.
        let ids: &[i64] = if rank == 2 { &[] } else { &[59, 0, 59] };
        let next = kv.row_sparse_pull("emb", ids, 0).expect("pull");
        (failed.to_string(), next.indices().to_vec(), next.data().shape().to_vec())
    });
    for (rank, (failed, next, shape)) in out.iter().enumerate() {
        assert!(failed.contains("60"), "rank {rank}: {failed}");
        let want: &[i64] = if rank == 2 { &[] } else { &[0, 59] };
        assert_eq!((next.as_slice(), shape.as_slice()), (want, &[want.len(), 17][..]), "rank {rank}");
    }
}

/// Worker `rank`'s pushes of steps `from..from + n` into every table, with Adam.
fn train(kv: &KVStore, rank: usize, from: u64, n: u64) {
    for step in from..from + n {
        for (t, (k, ..)) in TABLES.iter().enumerate() {
            kv.push_row_sparse(*k, &[grad(t, step, rank)], 0).expect("push");
        }
    }
}

/// Every table's value, pulled dense.
fn tables(kv: &KVStore) -> Vec<Vec<u64>> {
    TABLES.iter().map(|(k, ..)| bits(&kv.pull_new(*k, 0).expect("pull"))).collect()
}

/// A checkpoint of tables on owners, saved in parts (every worker opens the file) and
/// gathered (a state file), is the replicated layout's; loaded at another number of
/// workers, into either layout, training goes on alike, and the tables hold the rows
/// the saving job had.
#[test]
fn checkpoints_of_tables_on_owners_are_the_replicated_ones_and_restore_at_any_size() {
    let dir = Arc::new(kvstore_tests::TempDir::new("tables-checkpoints"));
    let d = Arc::clone(&dir);
    let saved = run_members(3, move |rank, member| {
        let mut saved = Vec::new();
        for (name, kv) in [("owners", on_owners(&member)), ("replicated", replicated(&member))] {
            for (t, (k, shape, dtype)) in TABLES.iter().enumerate() {
                let init = RowSparse::from_dense(&pseudo(shape, *dtype, 40 + t as u64)).expect("rows");
                kv.init_row_sparse(*k, &init).expect("init");
            }
            kv.set_optimizer(Optimizer::builder("adam").param("wd", 0.01).build().expect("adam")).expect("set");
            train(&kv, rank, 0, 30);
            kv.save_checkpoint(d.dir().join(format!("{name}.ckpt"))).expect("save_checkpoint");
            kv.save_optimizer_states(d.dir().join(format!("{name}-{rank}.states"))).expect("save states");
            saved.push(tables(&kv));
        }
        saved
    });
    let read = |name: &str| std::fs::read(dir.dir().join(name)).expect("a file");
    assert!(super::owners::same_file(&read("owners.ckpt"), &read("replicated.ckpt")), "the checkpoints differ");
    for rank in 0..3 {
        let (o, r) = (read(&format!("owners-{rank}.states")), read(&format!("replicated-{rank}.states")));
        assert!(super::owners::same_file(&o, &r), "rank {rank}'s state files differ");
    }
    let d = Arc::clone(&dir);
    let restored = run_members(2, move |rank, member| {
        let mut got = Vec::new();
        for (kv, file) in [
            (on_owners(&member), "owners.ckpt"),
            (on_owners(&member), "replicated.ckpt"),
            (replicated(&member), "owners.ckpt"),
        ] {
            kv.load_checkpoint(d.dir().join(file)).expect("load_checkpoint");
            let loaded = tables(&kv);
            train(&kv, rank, 30, 10);
            got.push((loaded, tables(&kv)));
        }
        got
    });
    for (rank, got) in restored.iter().enumerate() {
        for (i, (loaded, after)) in got.iter().enumerate() {
            assert_eq!(loaded, &saved[0][0], "rank {rank}, load {i}: the tables are not the saved ones");
            assert_eq!(after, &got[0].1, "rank {rank}, load {i}: training after the load parts");
        }
    }
}

/// `run_members`, failed after `secs` (a hang) instead of waiting for ever.
fn within<T: Send + 'static>(
    secs: u64,
    n: usize,
    f: impl Fn(usize, Arc<ThreadMember>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_members(n, f));
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs)).expect("the workers hung (or one panicked)")
}

/// `n` rows of `shape` at `rows`.
fn rows_of(shape: &[usize], rows: Vec<i64>, seed: u64) -> RowSparse {
    RowSparse::new(pseudo(&[&[rows.len()][..], &shape[1..]].concat(), DType::F32, seed), rows, shape).expect("rows")
}

/// A custom updater that fails on a table's owner stops the push at that key on every
/// worker, as without owners: a later key is updated on no worker (found by the red
/// team: the workers that own nothing of the table went on and updated it).
#[test]
fn an_updater_failing_on_a_tables_owner_stops_the_push_there_on_every_worker() {
    let out = within(60, 2, |_, member| {
        [on_owners(&member), replicated(&member)].map(|kv| {
            // "a": a table owned whole by rank 0; "b": another; "d": a dense key.
            for (k, seed) in [("a", 1), ("b", 2)] {
                let init = RowSparse::from_dense(&pseudo(&[4, 3], DType::F32, seed)).expect("rows");
                kv.init_row_sparse(k, &init).expect("init");
            }
            kv.init("d", &pseudo(&[4, 3], DType::F32, 3)).expect("init");
            kv.set_updater(|k: &kvstore_core::Key, _: usize, g: &kvstore_core::NDArray, w: &kvstore_core::NDArray| {
                match k.as_str() {
                    "a" => Err(kvstore_core::Error::invalid_argument("no a")),
                    _ => w.add_assign(g),
                }
            })
            .expect("set_updater");
            let g = |k: &str| (kvstore_core::Key::from(k), vec![rows_of(&[4, 3], vec![2], 9)]);
            let failed = kv.push_row_sparse_many(&[g("a"), g("b"), g("d")], 0).is_err();
            let values: Vec<Vec<u64>> =
                ["a", "b", "d"].iter().map(|k| bits(&kv.pull_new(*k, 0).expect("pull"))).collect();
            (failed, values)
        })
    });
    for (rank, [owned, whole]) in out.iter().enumerate() {
        assert!(owned.0 && whole.0, "rank {rank}: the push did not fail");
        assert_eq!(owned.1, whole.1, "rank {rank}: the layouts part after a failed updater");
        assert_eq!(owned.1, out[0][0].1, "rank {rank}: the workers part");
    }
}

/// A state file of tables on owners loads back into them, whole-owned and split (found
/// by the red team: every rank refused the table's shape, or only its non-owners did),
/// and training goes on as the replicated layout's.
#[test]
fn state_files_of_tables_on_owners_load_into_them() {
    let dir = Arc::new(kvstore_tests::TempDir::new("tables-states"));
    let out = within(60, 2, move |rank, member| {
        [on_owners(&member), replicated(&member)].map(|kv| {
            for (t, (k, shape, dtype)) in TABLES.iter().enumerate() {
                let init = RowSparse::from_dense(&pseudo(shape, *dtype, 40 + t as u64)).expect("rows");
                kv.init_row_sparse(*k, &init).expect("init");
            }
            kv.set_optimizer(Optimizer::builder("adam").build().expect("adam")).expect("set");
            train(&kv, rank, 0, 5);
            let path = dir.dir().join(format!("{rank}.states"));
            if kv.save_optimizer_states(&path).is_ok() {
                kv.load_optimizer_states(&path).expect("load_optimizer_states");
            }
            train(&kv, rank, 5, 5);
            tables(&kv)
        })
    });
    for (rank, [owned, whole]) in out.iter().enumerate() {
        assert_eq!(owned, whole, "rank {rank}");
    }
}

/// A pull of a table with other keys whose pull fails on one worker (an out of another
/// shape) fails on every worker instead of leaving the others in the table's gather;
/// without comparing calls, a bad row id on one worker fails its pull alone (found by
/// the red team: both hung).
#[test]
fn a_pull_of_a_table_that_fails_on_one_worker_hangs_no_worker() {
    let out = within(60, 2, |rank, member| {
        let kv = builder(&member, Layout::Owners).bigarray_bound(10).build().expect("a store");
        kv.init_row_sparse("e", &RowSparse::from_dense(&pseudo(&[9, 3], DType::F32, 5)).expect("rows")).expect("init");
        kv.init("w", &pseudo(&[2, 2], DType::F32, 6)).expect("init");
        let keys: Vec<kvstore_core::Key> = vec!["e".into(), "w".into()];
        let w = kvstore_core::NDArray::zeros(if rank == 1 { &[2, 3] } else { &[2, 2] }).expect("out");
        let both = kv.pull(&keys[..], &[kvstore_core::NDArray::zeros(&[9, 3]).expect("out"), w][..], 0).is_err();
        let group: Arc<dyn Collective> = Arc::clone(&member) as _;
        let blind = KVStore::builder("dist_sync").num_threads(1).collective(group).compare_calls(false);
        let blind = blind.bigarray_bound(10).build().expect("a store");
        let table = RowSparse::from_dense(&pseudo(&[9, 3], DType::F32, 5)).expect("rows");
        blind.init_row_sparse("e", &table).expect("init");
        let ids: &[i64] = if rank == 1 { &[9] } else { &[1] };
        (both, blind.row_sparse_pull("e", ids, 0).is_err())
    });
    assert_eq!(out, vec![(true, false), (true, true)]);
}

/// A custom updater on a table split across the owners runs on each owner's rows, as
/// MXNet's servers ran it on theirs: an updater that treats each row alone gives the
/// replicated layout's bits (MXNet's nightly test's optimizer is one).
#[test]
fn a_custom_updater_runs_on_each_owners_rows_of_a_split_table() {
    let out = within(60, 3, |rank, member| {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kvs = [on_owners(&member), replicated(&member)];
        for kv in &kvs {
            kv.init_row_sparse("emb", &RowSparse::from_dense(&pseudo(&[60, 17], DType::F32, 1)).expect("rows"))
                .expect("init");
            let seen = Arc::clone(&seen);
            kv.set_updater(
                move |_: &kvstore_core::Key, _: usize, g: &kvstore_core::NDArray, w: &kvstore_core::NDArray| {
                    seen.lock().expect("seen").push(w.shape().to_vec());
                    w.add_assign(g).and_then(|()| w.add_assign(g))
                },
            )
            .expect("set_updater");
        }
        for step in 0..5u64 {
            let g = rows_of(&[60, 17], vec![step as i64, 20 + rank as i64, 59], step * 10 + rank as u64);
            for kv in &kvs {
                kv.push_row_sparse("emb", std::slice::from_ref(&g), 0).expect("push");
            }
        }
        let values: Vec<Vec<u64>> = kvs.iter().map(|kv| bits(&kv.pull_new("emb", 0).expect("pull"))).collect();
        let shapes = seen.lock().expect("seen").clone();
        (values, shapes)
    });
    for (rank, (values, shapes)) in out.iter().enumerate() {
        assert_eq!(values[0], values[1], "rank {rank}");
        // 60 rows at 1020 elements on 3 ranks: 20 rows each on owners, the whole table
        // replicated, at each of the 5 pushes.
        let mut shapes = shapes.clone();
        shapes.sort();
        assert_eq!(shapes, [vec![vec![20, 17]; 5], vec![vec![60, 17]; 5]].concat(), "rank {rank}");
    }
}

/// A push with a table whose earlier key's updater fails on one worker only (its
/// memory, say) fails on every worker, and no worker waits for another (found by the
/// red team: the failing worker skipped the table's agreement, and the others hung).
#[test]
fn a_key_failing_on_one_worker_before_a_table_hangs_no_worker() {
    let out = within(60, 2, |rank, member| {
        let kv = on_owners(&member);
        kv.init("d0", &pseudo(&[3, 3], DType::F32, 3)).expect("init");
        kv.init_row_sparse("a", &RowSparse::from_dense(&pseudo(&[3, 3], DType::F32, 2)).expect("rows")).expect("init");
        kv.set_updater(move |k: &kvstore_core::Key, _: usize, g: &kvstore_core::NDArray, w: &kvstore_core::NDArray| {
            match k.as_str() == "d0" && rank == 0 {
                true => Err(kvstore_core::Error::invalid_argument("d0 fails on rank 0")),
                false => w.add_assign(g),
            }
        })
        .expect("set_updater");
        let g = |k: &str| (kvstore_core::Key::from(k), vec![rows_of(&[3, 3], vec![1], 9)]);
        let failed = kv.push_row_sparse_many(&[g("d0"), g("a")], 0).is_err();
        // The next call works, and the table is as it was on every worker.
        (failed, bits(&kv.pull_new("a", 0).expect("pull")))
    });
    let table = bits(&pseudo(&[3, 3], DType::F32, 2));
    assert_eq!(out, vec![(true, table.clone()), (true, table)]);
}

/// A pushpull whose outs include a table pushes its values (found by the red team: the
/// push was dropped when a pulled key was a table), blocking or not.
#[test]
fn a_pushpull_into_a_key_with_a_table_among_its_outs_pushes() {
    let out = within(60, 2, |rank, member| {
        [on_owners(&member), replicated(&member)].map(|kv| {
            kv.init("d", &pseudo(&[3, 3], DType::F32, 1)).expect("init");
            let table = RowSparse::from_dense(&pseudo(&[9, 3], DType::F32, 2)).expect("rows");
            kv.init_row_sparse("s", &table).expect("init");
            let (d, s) = (kvstore_core::Key::from("d"), kvstore_core::Key::from("s"));
            let v = [pseudo(&[3, 3], DType::F32, 50 + rank as u64)];
            let outs = [
                kvstore_core::NDArray::zeros(&[3, 3]).expect("out"),
                kvstore_core::NDArray::zeros(&[9, 3]).expect("out"),
            ];
            let keys = [d.clone(), s];
            kv.pushpull_pairs(std::slice::from_ref(&d), &v[..], &keys, &outs[..], 0).expect("pushpull");
            kv.pushpull_pairs_async(std::slice::from_ref(&d), &v[..], &keys, &outs[..], 0).wait().expect("async");
            (bits(&outs[0]), bits(&outs[1]), bits(&kv.pull_new("d", 0).expect("pull")))
        })
    });
    for (rank, [owned, whole]) in out.iter().enumerate() {
        assert_eq!(owned, whole, "rank {rank}");
        assert_ne!(owned.2, bits(&pseudo(&[3, 3], DType::F32, 1)), "rank {rank}: d was not pushed");
    }
}
