//! Compiles `proto/dlock.proto` with protox, a pure-Rust protobuf compiler, so
//! building needs nothing beyond the Rust toolchain (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/dlock.proto");
    let descriptors = protox::compile(["proto/dlock.proto"], ["proto"])?;
    prost_build::Config::new()
        // Rare answers on the heap: every Response is built on the hot
        // path, and inline the cluster status or the server's counts with
        // their busiest keys would more than double its size.
        .boxed(".dlock.Response.cluster")
        .boxed(".dlock.Response.server_stats")
        .compile_fds(descriptors)?;
    Ok(())
}
