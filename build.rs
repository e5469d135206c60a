//! Compiles `proto/dlock.proto` with protox, a pure-Rust protobuf compiler, so
//! building needs nothing beyond the Rust toolchain (no system `protoc`).
//!
//! It is the build script of the `dlock-proto` crate (`dlock-proto/`), which
//! holds the wire types; the contract and this script stay at the top of the
//! repository, where the product's layout puts them.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Cargo runs a build script in its package's directory, dlock-proto/.
    let proto = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let file = proto.join("dlock.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([&file], [&proto])?;
    prost_build::Config::new()
        // Rare answers on the heap: every Response is built on the hot
        // path, and inline the cluster status or the server's counts with
        // their busiest keys would more than double its size.
        .boxed(".dlock.Response.cluster")
        .boxed(".dlock.Response.server_stats")
        .compile_fds(descriptors)?;
    Ok(())
}
