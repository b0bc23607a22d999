//! Fuzz target: arbitrary bytes as the project's root `charly.yml`, through
//! `load` + `resolve` + `validate` (what `charly validate` runs). The root
//! file is where issue 18 found a panic: a root that failed to parse left no
//! namespace 0, and the vocabulary step indexed it.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "project.rs"]
mod project;

fuzz_target!(|bytes: &[u8]| {
    project::check(&[
        ("charly.yml", bytes),
        ("candy/a/charly.yml", project::CANDY),
    ]);
});
