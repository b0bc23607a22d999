//! Node-form (schema 2026.174) `check:` steps reach check beds: the words
//! that apply to a container run as the classic kinds, the rest are listed
//! as skipped with the reason, never passed or dropped. A fake bed host
//! answers like a container where everything holds, so whatever is not
//! skipped passes, and a broken answer makes the matching check fail.

use charly_cache::{NodeKey, Store};
use charly_engine::check::{
    Bed, BedHost, BedReport, CheckResult, ExecOutput, Outcome, box_checks, run_bed,
};
use charly_rules::check::CheckKind;
use std::sync::Mutex;
use std::time::Duration;

/// A bed where every file exists (a regular file, mode 0755), every package
/// is installed and every command prints `hello`, unless `broken` is set.
struct FakeBed {
    scripts: Mutex<Vec<String>>,
    broken: bool,
}

impl BedHost for FakeBed {
    fn start(&self, _: &str, _: &str, _: &str, _: &[String]) -> Result<String, String> {
        Ok("bed".into())
    }
    fn exec(&self, _: &str, _: &str, script: &str, _: Duration) -> Result<ExecOutput, String> {
        self.scripts
            .lock()
            .map_err(|e| e.to_string())?
            .push(script.to_string());
        let ok = ExecOutput {
            status: 0,
            stdout: if script.starts_with("stat ") {
                "regular file|755".into()
            } else {
                "hello\n".into()
            },
            stderr: String::new(),
        };
        if self.broken {
            return Ok(ExecOutput {
                status: 1,
                stdout: "missing".into(),
                ..ok
            });
        }
        Ok(ok)
    }
    fn remove(&self, _: &str) {}
}

const ROOT: &str = "version: 2026.174.1100\ndiscover:\n  - path: candy\n";

const TOOLS: &str = "\
tools:
  candy:
    version: 2026.174.1100
    description: checks of every shape
  tools-file:
    check: the tool is installed
    plugin: file
    plugin_input: {file: /usr/bin/tool, exists: true, mode: \"0755\"}
  tools-command:
    check: the tool greets
    plugin: command
    plugin_input: {command: tool --hello}
    stdout: hello
  tools-package:
    check: the package is installed
    plugin: package
    plugin_input: {package: tool, installed: true}
  tools-runtime:
    check: the service answers
    context: [runtime]
    plugin: command
    plugin_input: {command: tool --ping}
  tools-group:
    check: the group exists
    plugin: unix_group
    plugin_input: {unix_group: tool, gid: 1234}
  tools-mount:
    check: a mount is there
    context: [build]
    plugin: mount
    plugin_input: {mount: /data, filesystem: ext4}
  tools-text:
    check: file=/etc/tool.conf
";

const IMAGE: &str = "\
img:
  candy:
    version: 2026.174.1100
    base: debian:13
    build: [deb]
  img-candy:
    candy: [tools]
";

fn run(broken: bool) -> (BedReport, Vec<String>) {
    let t = tempfile::tempdir().expect("tmp");
    for (rel, body) in [
        ("charly.yml", ROOT),
        ("candy/tools/charly.yml", TOOLS),
        ("candy/img/charly.yml", IMAGE),
    ] {
        charly_testutil::write(t.path(), rel, body);
    }
    let (p, r) = charly_testutil::open(t.path());
    let errors: Vec<String> = p
        .diags
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.one_line(&p.sources))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let b = match r.boxes.get("img") {
        Some(Ok(b)) => b,
        other => panic!("img resolves: {other:?}"),
    };
    let mut diags = Vec::new();
    let checks = box_checks(&p, b, &mut diags);
    assert!(!diags.iter().any(|d| d.is_error()), "{diags:?}");
    assert_eq!(checks.len(), 7, "every check step is a check: {checks:#?}");
    assert!(
        checks.iter().any(
            |(_, c)| matches!(&c.kind, CheckKind::Unsupported { plugin } if plugin == "unix_group")
        ),
        "{checks:#?}"
    );
    let store = Store::open(&t.path().join("store")).expect("store");
    let host = FakeBed {
        scripts: Mutex::new(Vec::new()),
        broken,
    };
    let bed = Bed {
        b,
        image: "localhost/img:test".into(),
        checks,
        init: None,
        format: "deb".into(),
    };
    let report = run_bed(
        &host,
        &store,
        &NodeKey::from_bytes([7; 32]),
        &bed,
        false,
        true,
    );
    let scripts = host.scripts.lock().map(|s| s.clone()).unwrap_or_default();
    (report, scripts)
}

fn result<'a>(r: &'a BedReport, id: &str) -> &'a CheckResult {
    r.checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("a result for {id}: {r:#?}"))
}

#[test]
fn node_form_checks_run_in_a_bed_and_unsupported_words_are_skipped_with_the_reason() {
    let (r, scripts) = run(false);
    assert!(r.error.is_none(), "{r:#?}");
    for id in ["tools-file", "tools-command", "tools-package", "tools-text"] {
        assert_eq!(result(&r, id).outcome, Outcome::Pass, "{id}: {r:#?}");
    }
    let runtime = result(&r, "tools-runtime");
    assert_eq!(runtime.outcome, Outcome::Skip);
    assert!(
        runtime
            .reason
            .as_deref()
            .is_some_and(|s| s.contains("deploy-scope")),
        "{runtime:?}"
    );
    for (id, word) in [("tools-group", "unix_group"), ("tools-mount", "mount")] {
        let c = result(&r, id);
        assert_eq!(c.outcome, Outcome::Skip, "{id}");
        assert!(
            c.reason
                .as_deref()
                .is_some_and(|s| s.contains(&format!("plugin `{word}` is not supported"))),
            "{c:?}"
        );
    }
    assert_eq!(r.counts(), (4, 0, 3), "{r:#?}");
    // The supported words really ran in the bed: stat, the command, dpkg.
    assert!(scripts.iter().any(|s| s.contains("/usr/bin/tool")));
    assert!(scripts.iter().any(|s| s.contains("tool --hello")));
    assert!(scripts.iter().any(|s| s.contains("dpkg-query")));
    assert!(
        !scripts
            .iter()
            .any(|s| s.contains("tool --ping") || s.contains("/data"))
    );
}

#[test]
fn a_node_form_check_that_does_not_hold_fails() {
    let (r, _) = run(true);
    for id in ["tools-file", "tools-command", "tools-package", "tools-text"] {
        assert_eq!(result(&r, id).outcome, Outcome::Fail, "{id}: {r:#?}");
    }
    assert_eq!(r.counts(), (0, 4, 3));
    assert!(!r.ok());
}
