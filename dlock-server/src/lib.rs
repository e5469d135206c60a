//! dlock-server: the dlock lock server.
//!
//! - [`table`]: the lock table, a synchronous state machine holding every lock rule.
pub mod table;
