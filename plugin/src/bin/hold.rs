//! charly-plugin-hold: a stand-in for charly in the host's tests of
//! [`charly_plugin::Plugin`]'s lifetime. It starts the plugin executable
//! named by its first argument on a thread that then exits (as a rayon or
//! tokio worker that asked for a plugin first may), checks the plugin still
//! answers `Describe` after that, prints the plugin's pid on stdout and
//! waits to be killed. A test SIGKILLs it and watches the plugin go.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use charly_plugin::{Plugin, PluginOptions};

fn main() -> ExitCode {
    let Some(exe) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: charly-plugin-hold <plugin executable>");
        return ExitCode::from(2);
    };
    let started = std::thread::spawn(move || Plugin::start(&exe, PluginOptions::default())).join();
    let plugin = match started {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            eprintln!("hold: {e}");
            return ExitCode::from(1);
        }
        Err(_) => {
            eprintln!("hold: the starting thread panicked");
            return ExitCode::from(1);
        }
    };
    // The starting thread is gone; give a wrongly aimed parent-death signal
    // time to land before asking.
    std::thread::sleep(Duration::from_millis(300));
    if let Err(e) = plugin.describe() {
        eprintln!("hold: the plugin no longer answers after its starting thread ended: {e}");
        return ExitCode::from(1);
    }
    let Some(pid) = plugin.pid() else {
        eprintln!("hold: no pid");
        return ExitCode::from(1);
    };
    {
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{pid}").and_then(|()| out.flush()).is_err() {
            return ExitCode::from(1);
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
