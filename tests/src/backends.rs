//! The backends the shared tests run on ([`Backend`]: [`Cpu`], [`Gpus`]), and
//! [`backend_tests!`](crate::backend_tests), which makes the shared tests into tests of
//! one backend.

use kvstore_core::{Context, KVStore};

/// What a conformance case needs from a backend: stores and the contexts of devices.
pub trait Backend {
    /// A short name for messages.
    fn name(&self) -> &str;
    /// A store of `kind` ("local" or "device").
    fn store(&self, kind: &str) -> KVStore;
    /// The kind of the stores `store(kind)` makes: `kind`, unless the backend maps it.
    fn store_kind<'a>(&self, kind: &'a str) -> &'a str {
        kind
    }
    /// The context of device `i` (values pushed "from several devices").
    fn ctx(&self, i: u32) -> Context;
}

/// The host backend: `cpu(i)` contexts.
pub struct Cpu;

impl Backend for Cpu {
    fn name(&self) -> &str {
        "cpu"
    }
    fn store(&self, kind: &str) -> KVStore {
        KVStore::create(kind).expect("create a store")
    }
    fn ctx(&self, i: u32) -> Context {
        Context::cpu(i)
    }
}

/// Device contexts `gpu(i % count)` of the installed device backend; `store(kind)`
/// makes `device` stores instead of `local` ones when `device_store` is set.
pub struct Gpus {
    /// How many devices the backend has.
    pub count: u32,
    /// Whether "local" stores become "device" stores.
    pub device_store: bool,
}

impl Backend for Gpus {
    fn name(&self) -> &str {
        if self.device_store { "gpu (device store)" } else { "gpu (local store)" }
    }
    fn store(&self, kind: &str) -> KVStore {
        KVStore::create(self.store_kind(kind)).expect("create a store")
    }
    fn store_kind<'a>(&self, kind: &'a str) -> &'a str {
        if self.device_store && kind == "local" { "device" } else { kind }
    }
    fn ctx(&self, i: u32) -> Context {
        Context::gpu(i % self.count.max(1))
    }
}

/// Makes the shared tests of the lists named after `;` (`cases`: the conformance cases
/// of [`cases`](crate::cases), `properties`: the property tests of
/// [`properties`](crate::properties)) into tests of one backend: one `#[test]` per
/// shared function, by its name, in a module `$module`. Each list is written once,
/// here, and every backend's binary runs it.
///
/// `$backend` is evaluated in each test, inside `$module` (so it sees the items of the
/// module around it), and gives the [`Backend`]: `cpu = Cpu` makes the tests
/// `cpu::case_01_init_then_pull` and so on. After `available` it gives an `Option` of
/// one instead: `None` skips the test, for machines without the device (the expression
/// prints why, as kvstore-cuda's GPU tests print `SKIP: no CUDA device`).
///
/// ```
/// use kvstore_tests::Gpus;
///
/// kvstore_tests::backend_tests!(cpu = kvstore_tests::Cpu; cases, properties);
/// kvstore_tests::backend_tests!(gpu_device_store = available gpus(true); cases);
///
/// /// The devices, or `None` (after printing why) where there are none.
/// fn gpus(device_store: bool) -> Option<Gpus> {
///     Some(Gpus { count: 4, device_store })
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($module:ident = available $backend:expr; $($list:ident),+ $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            /// The backend of this module's tests, or `None` where the machine lacks it.
            fn backend() -> ::core::option::Option<impl $crate::Backend> {
                $backend
            }

            $($crate::backend_tests! { @$list tests })+
        }
    };
    ($module:ident = $backend:expr; $($list:ident),+ $(,)?) => {
        $crate::backend_tests!($module = available ::core::option::Option::Some($backend); $($list),+);
    };

    // The lists. `tests` makes the tests; `names` their names, for the check that every
    // shared case is listed.
    (@cases $then:ident) => {
        $crate::backend_tests! { @$then $crate::cases;
            case_01_init_then_pull,
            case_02_push_assigns,
            case_03_push_from_devices_sums_and_pull_broadcasts,
            case_04_updater_merges_later_pushes,
            case_05_list_push_with_updater,
            case_06_clojure_tutorial_string_keys,
            case_07_aggregate_four_devices,
            case_08_repeated_keys_group_and_sum,
            case_09_updater_call_log,
            case_10_updater_index_is_first_init_order,
            case_11_errors,
            case_14_pushpull_in_place,
            case_15_broadcast,
            case_16_f16_sums_accumulate_in_f32,
            case_17_f32_sums_run_left_to_right,
            case_18_push_copies,
            case_22_metadata,
        }
    };
    (@properties $then:ident) => {
        $crate::backend_tests! { @$then $crate::properties;
            random_call_sequences_agree_with_the_model,
            an_init_list_with_one_bad_key_inits_nothing,
            a_push_list_with_one_bad_entry_pushes_nothing,
            big_pushes_give_the_naive_sum_bit_for_bit_for_any_thread_count,
        }
    };

    (@tests $shared:path; $($test:ident),+ $(,)?) => {
        $(
            #[test]
            fn $test() {
                use $shared as shared;
                if let ::core::option::Option::Some(backend) = backend() {
                    shared::$test(&backend);
                }
            }
        )+
    };
    (@names $shared:path; $($test:ident),+ $(,)?) => {
        &[$(::core::stringify!($test)),+]
    };
}
