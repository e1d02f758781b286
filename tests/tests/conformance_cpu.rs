//! conformance_cpu
