//! The faults a run injects: hostile and broken clients against a single
//! server (`clients`), and against a cluster the nodes themselves killed,
//! paused, partitioned and given damaged logs (`nodes`).

pub mod clients;
pub mod nodes;
