//! Arbitrary input as a script of bytes fed to, and closes of, a few
//! connections: frame decoding, request decoding, validation and the lock
//! table, with their invariants checked after every step.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| dlock_server::fuzzing::session(data));
