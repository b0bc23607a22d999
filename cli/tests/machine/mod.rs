//! One "CI machine" of the remote-cache tests (registry and REAPI
//! backends alike): a copy of the graph fixture, its own store, the fake
//! runner's call log, and helpers to read summaries and stored outputs.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use charly_cache::{NodeKey, Store};

/// A copy of the graph fixture (builds write into the project).
pub fn project(dest: &Path) -> PathBuf {
    crate::project_copy::copy_project(&crate::project_copy::graph_fixture(), dest)
}

/// One machine: a project copy, a store, a fake-runner call log.
pub struct Machine {
    pub root: PathBuf,
    pub store: PathBuf,
    pub log: PathBuf,
}

impl Machine {
    pub fn new(t: &Path, name: &str) -> Machine {
        let root = project(&t.join(name).join("project"));
        Machine {
            root,
            store: t.join(name).join("store"),
            log: t.join(name).join("runner.log"),
        }
    }

    pub fn cmd(&self, remote: Option<&str>) -> Command {
        let mut c = Command::new(assert_cmd::cargo::cargo_bin("charly"));
        c.env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.store)
            .env("CHARLY_FAKE_LOG", &self.log)
            .env_remove("CHARLY_REMOTE")
            .env_remove("CHARLY_REMOTE_READ_ONLY")
            .env_remove("CHARLY_REMOTE_REQUIRED")
            .env_remove("CHARLY_REMOTE_TOKEN")
            .arg("-C")
            .arg(&self.root);
        if let Some(r) = remote {
            c.arg("--remote").arg(r);
        }
        c
    }

    /// `box build left right --runner fake`, with its JSON summary.
    pub fn build(&self, remote: Option<&str>, extra: &[&str]) -> (Output, serde_json::Value) {
        let summary = self.store.with_extension("summary.json");
        let _ = std::fs::remove_file(&summary);
        let out = self
            .cmd(remote)
            .args([
                "box", "build", "left", "right", "--runner", "fake", "-j", "2",
            ])
            .args(extra)
            .arg("--summary-json")
            .arg(&summary)
            .output()
            .expect("run charly");
        (out, summary_json(&summary))
    }

    /// Runner calls so far (`what node`), without image loads.
    pub fn builds(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("load "))
            .map(str::to_string)
            .collect()
    }
}

/// A `--summary-json` file, or `null` if the run wrote none.
pub fn summary_json(path: &Path) -> serde_json::Value {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Non-source nodes of a summary: id -> (key, state).
pub fn nodes(s: &serde_json::Value) -> BTreeMap<String, (String, String)> {
    s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["kind"] != "source")
        .map(|n| {
            (
                n["id"].as_str().expect("id").to_string(),
                (
                    n["key"].as_str().expect("key").to_string(),
                    n["state"].as_str().expect("state").to_string(),
                ),
            )
        })
        .collect()
}

/// Every output of `key`, as bytes, from the store at `dir`.
pub fn outputs(dir: &Path, key: &str) -> BTreeMap<String, Vec<u8>> {
    let store = Store::open(dir).expect("store");
    let key: NodeKey = key.parse().expect("key");
    let rec = store
        .get_record(&key)
        .expect("lookup")
        .unwrap_or_else(|| panic!("no record for {key:?} in {}", dir.display()));
    rec.outputs
        .iter()
        .map(|(name, o)| {
            let bytes = store
                .get_blob(&o.digest)
                .expect("blob read")
                .unwrap_or_else(|| panic!("blob of {name} missing"));
            (name.clone(), bytes.into_vec())
        })
        .collect()
}
