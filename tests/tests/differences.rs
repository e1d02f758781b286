//! differences
