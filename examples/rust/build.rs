//! Compiles the Headwater API (`proto/headwater/v1/headwater.proto`, two folders up) into
//! Rust with tonic-prost-build: message types and the client stubs only (no servers).
//!
//! There is no `protoc` on the build machines, so the one vendored by the
//! `protoc-bin-vendored` crate is used unless `PROTOC` already names one. The proto is
//! compiled again whenever it changes (`cargo:rerun-if-changed`), so fields the server
//! side adds show up here at the next build; prost skips fields it does not know, so a
//! binary built from an older proto keeps working against a newer node.

use std::path::Path;

const PROTO_ROOT: &str = "../../proto";
const PROTO_FILE: &str = "../../proto/headwater/v1/headwater.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_FILE}");
    println!("cargo:rerun-if-env-changed=PROTOC");
    if !Path::new(PROTO_FILE).is_file() {
        return Err(format!(
            "{PROTO_FILE} not found: build from examples/rust in a Headwater checkout"
        )
        .into());
    }
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: a build script is single-threaded; nothing else reads the environment
        // while it is changed.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&[PROTO_FILE], &[PROTO_ROOT])?;
    Ok(())
}
