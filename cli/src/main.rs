//! `charly`: the command line. Everything lives in the `charly_cli` library.

fn main() -> std::process::ExitCode {
    charly_cli::main()
}
