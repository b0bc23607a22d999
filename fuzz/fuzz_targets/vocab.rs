//! Fuzz target: arbitrary bytes as the root's vocabulary file (`build.yml`,
//! or `charly/build.yml` when the first byte is odd), through `load` (its
//! `fill_vocab` step classifies each document and merges builders, distros,
//! inits over the embedded default) + `resolve` + `validate`, with a box that
//! uses the vocabulary (distro, builder) so resolution reads the merged
//! entries.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "project.rs"]
mod project;

const BOX: &[u8] = b"box:\n  name: b\n  version: 1.0.0\n  base: quay.io/fedora/fedora:43\n  distro: [fedora]\n  candy: [a]\n";

fuzz_target!(|bytes: &[u8]| {
    let file = if bytes.first().is_some_and(|b| b & 1 == 1) {
        "charly/build.yml"
    } else {
        "build.yml"
    };
    project::check(&[
        ("charly.yml", project::ROOT),
        ("candy/a/charly.yml", project::CANDY),
        ("box/b/charly.yml", BOX),
        (file, bytes),
    ]);
});
