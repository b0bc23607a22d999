//! Generates the protobuf messages and tonic stubs of the plugin protocol at
//! build time with protox (a protobuf compiler in Rust), so no system `protoc`
//! is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/plugin.proto",
        "proto/grpc_broker.proto",
        "proto/grpc_controller.proto",
        "proto/grpc_stdio.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Unimplemented RPCs answer UNIMPLEMENTED, so a plugin serves only what it has.
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
