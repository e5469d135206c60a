//! The network floor: the accept loop, one task per connection, framing
//! and pipelining, TLS. It moves frames between sockets and the
//! [`crate::service`] and knows nothing of locks.

pub mod connection;
pub mod pipeline;
pub mod server;
pub mod shared;
pub mod tls;
pub mod transport;
