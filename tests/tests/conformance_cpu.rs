//! The conformance cases of the reference (§10) that concern a local store, on `cpu(i)`
//! contexts. Each test calls the shared case of `kvstore_tests` by the same name.

use kvstore_tests::{CASES, Cpu};

macro_rules! cpu_cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                kvstore_tests::$name(&Cpu);
            }
        )*
        const CPU_CASES: &[&str] = &[$(stringify!($name)),*];
    };
}

cpu_cases!(
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
);

#[test]
fn every_shared_case_has_a_cpu_test() {
    let mut shared: Vec<&str> = CASES.iter().map(|(name, _)| *name).collect();
    let mut here = CPU_CASES.to_vec();
    shared.sort_unstable();
    here.sort_unstable();
    assert_eq!(shared, here);
}
