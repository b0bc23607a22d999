//! `charly`: the command line. Everything lives in the `charly_cli` library.

/// mimalloc, not the system allocator: see the workspace Cargo.toml.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    charly_cli::main()
}
