//! Helpers for dlock's tests and load tools (`dlock-bench`, `dlock-torture`,
//! the server's resource tests), kept out of the libraries they test.
//!
//! - [`proc_sample`]: CPU time and memory of a process, from /proc.

#![warn(missing_docs)]

pub mod proc_sample;
