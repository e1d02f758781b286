//! errors
