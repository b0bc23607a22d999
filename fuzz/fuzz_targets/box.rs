//! Fuzz target: arbitrary bytes as a discovered box file
//! (`box/b/charly.yml`) of a valid project with one candy, through `load` +
//! `resolve` + `validate` (what `charly validate` runs): box registration,
//! base chains, distro cascade and candy resolution all see the input.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "project.rs"]
mod project;

fuzz_target!(|bytes: &[u8]| {
    project::check(&[
        ("charly.yml", project::ROOT),
        ("candy/a/charly.yml", project::CANDY),
        ("box/b/charly.yml", bytes),
    ]);
});
