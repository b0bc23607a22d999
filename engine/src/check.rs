//! Check beds: run a box's `eval:` checks in a disposable container.
//!
//! A bed is a container of the box image (built with `--dev-local-pkg`,
//! reusing every cached node). When the box's candies define services the
//! bed runs the box's init (supervisord) so `service:` checks see them;
//! otherwise it just sleeps. Build-scope checks run inside it as the box
//! user; deploy-scope checks, host-side checks and checks needing deploy-time
//! variables are reported as skipped with the reason. A bed whose image key
//! and check definitions are unchanged and whose last result was all-pass is
//! reported as cached without starting a container.

use charly_cache::{NodeKey, Record, Store};
use charly_rules::Diagnostic;
use charly_rules::check::{
    Check, CheckKind, CheckScope, Matcher, deploy_only_var, expand_user_vars, parse_checks,
};
use charly_rules::load::Project;
use charly_rules::resolve::ResolvedBox;
use charly_rules::sh;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Output of a command run in a bed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit status (-1 when killed).
    pub status: i32,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

/// Where beds run (podman in practice).
pub trait BedHost: Send + Sync {
    /// Starts a container of `image` named `name` running `cmd` (entrypoint
    /// replaced) as `user`; returns its id.
    fn start(&self, image: &str, name: &str, user: &str, cmd: &[String]) -> Result<String, String>;
    /// Runs a shell script inside as `user`.
    fn exec(
        &self,
        id: &str,
        user: &str,
        script: &str,
        timeout: Duration,
    ) -> Result<ExecOutput, String>;
    /// Removes the container.
    fn remove(&self, id: &str);
}

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It held.
    Pass,
    /// It did not.
    Fail,
    /// Not run here (the reason says why).
    Skip,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Check id.
    pub id: String,
    /// Candy or box it belongs to (`candy:redis`, `box:jupyter`).
    pub owner: String,
    /// The outcome.
    pub outcome: Outcome,
    /// Why it was skipped, or what failed.
    pub reason: Option<String>,
    /// What was expected (failures).
    pub expected: Option<String>,
    /// What was found (failures).
    pub actual: Option<String>,
    /// Time spent.
    pub duration_ms: u64,
}

/// One bed's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BedReport {
    /// Box.
    pub box_name: String,
    /// Taken from an earlier all-pass run without starting a container.
    pub cached: bool,
    /// Results in candy order (the box's own last).
    pub checks: Vec<CheckResult>,
    /// A problem that stopped the bed (image missing, container failed).
    pub error: Option<String>,
}

impl BedReport {
    /// Counts (pass, fail, skip).
    pub fn counts(&self) -> (usize, usize, usize) {
        let c = |o: Outcome| self.checks.iter().filter(|r| r.outcome == o).count();
        (c(Outcome::Pass), c(Outcome::Fail), c(Outcome::Skip))
    }

    /// Whether everything that ran passed.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.counts().1 == 0
    }
}

/// The checks of a box: its candies' (base chain first, in order), then its own.
pub fn box_checks(
    p: &Project,
    b: &ResolvedBox,
    diags: &mut Vec<Diagnostic>,
) -> Vec<(String, Check)> {
    let mut out = Vec::new();
    for k in b.provided.iter().chain(b.candies.iter()) {
        let c = &p.candies[k];
        if let Some(e) = &c.def.eval {
            let owner = format!("candy:{}", c.name);
            for ch in parse_checks(&e.0, &owner, diags) {
                out.push((owner.clone(), ch));
            }
        }
    }
    let def = p.namespaces.iter().find_map(|n| {
        n.boxes
            .values()
            .find(|x| n.qualify(&x.name) == b.name)
            .map(|x| &x.def)
    });
    if let Some(e) = def.and_then(|d| d.eval.as_ref()) {
        let owner = format!("box:{}", b.name);
        for ch in parse_checks(&e.0, &owner, diags) {
            out.push((owner.clone(), ch));
        }
    }
    out
}

/// The key of a bed's result: the image key and every check definition.
pub fn bed_key(image_key: &NodeKey, checks: &[(String, Check)]) -> NodeKey {
    let mut h = blake3::Hasher::new();
    h.update(b"charly-check-bed-v1\0");
    h.update(image_key.as_bytes());
    for (owner, c) in checks {
        h.update(owner.as_bytes());
        h.update(b"\0");
        h.update(c.definition.to_string().as_bytes());
        h.update(b"\0");
    }
    NodeKey::from_bytes(*h.finalize().as_bytes())
}

/// A bed to run.
pub struct Bed<'a> {
    /// The box.
    pub b: &'a ResolvedBox,
    /// Its image reference.
    pub image: String,
    /// Its checks with owners.
    pub checks: Vec<(String, Check)>,
    /// The init command to run (services), else the bed sleeps.
    pub init: Option<Vec<String>>,
    /// The box's primary format (for package checks).
    pub format: String,
}

/// A bed's report when it needs no container: it has no checks, or (not
/// `force`) its image and checks are unchanged since an all-pass run, whose
/// report the store holds. None: [`run_bed`] starts a container (and the
/// image must be in podman first).
pub fn bed_without_container(
    store: &Store,
    image_key: &NodeKey,
    bed: &Bed<'_>,
    force: bool,
) -> Option<BedReport> {
    if bed.checks.is_empty() {
        return Some(BedReport {
            box_name: bed.b.name.clone(),
            cached: false,
            checks: Vec::new(),
            error: None,
        });
    }
    let key = bed_key(image_key, &bed.checks);
    if !force
        && let Ok(Some(rec)) = store.get_record(&key)
        && let Ok(prev) = serde_json::from_value::<BedReport>(rec.meta.clone())
        && prev.ok()
    {
        return Some(BedReport {
            cached: true,
            ..prev
        });
    }
    None
}

/// Runs one bed (or reports the cached result).
pub fn run_bed(
    host: &dyn BedHost,
    store: &Store,
    image_key: &NodeKey,
    bed: &Bed<'_>,
    keep: bool,
    force: bool,
) -> BedReport {
    if let Some(r) = bed_without_container(store, image_key, bed, force) {
        return r;
    }
    let key = bed_key(image_key, &bed.checks);
    let name = format!(
        "charly-bed-{}-{}",
        bed.b.name.replace('.', "-"),
        &key.to_hex()[..12]
    );
    host.remove(&name);
    let user = format!("{}:{}", bed.b.user.uid, bed.b.user.gid);
    let cmd: Vec<String> = bed
        .init
        .clone()
        .unwrap_or_else(|| vec!["sleep".into(), "infinity".into()]);
    let report = match host.start(&bed.image, &name, &user, &cmd) {
        Err(e) => BedReport {
            box_name: bed.b.name.clone(),
            cached: false,
            checks: Vec::new(),
            error: Some(format!("starting a bed of {}: {e}", bed.image)),
        },
        Ok(id) => {
            let checks = bed
                .checks
                .iter()
                .map(|(owner, c)| run_check(host, &id, bed, owner, c))
                .collect();
            if !keep {
                host.remove(&id);
            }
            BedReport {
                box_name: bed.b.name.clone(),
                cached: false,
                checks,
                error: None,
            }
        }
    };
    if report.ok() {
        let rec = Record {
            node_id: format!("check-bed:{}", bed.b.name),
            kind: "check-bed".into(),
            outputs: BTreeMap::new(),
            duration_ms: report.checks.iter().map(|c| c.duration_ms).sum(),
            producer: "charly".into(),
            key_inputs: serde_json::json!({"image": image_key.to_hex(), "checks": bed.checks.len()}),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            meta: serde_json::to_value(&report).unwrap_or_default(),
        };
        let _ = store.put_record(&key, &rec);
    }
    report
}

fn skip(owner: &str, c: &Check, reason: impl Into<String>) -> CheckResult {
    CheckResult {
        id: c.id.clone(),
        owner: owner.to_string(),
        outcome: Outcome::Skip,
        reason: Some(reason.into()),
        expected: None,
        actual: None,
        duration_ms: 0,
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

fn run_check(host: &dyn BedHost, id: &str, bed: &Bed<'_>, owner: &str, c: &Check) -> CheckResult {
    let u = &bed.b.user;
    if let CheckKind::Unsupported { plugin } = &c.kind {
        return skip(owner, c, unsupported_reason(plugin));
    }
    if c.scope == CheckScope::Deploy {
        return skip(
            owner,
            c,
            "deploy-scope check: runs against a deployment (charly bundle), not in a bed",
        );
    }
    if !c.in_container {
        return skip(
            owner,
            c,
            "in_container: false: runs on the host, not in a bed",
        );
    }
    if let Some(d) = c.exclude_distro.iter().find(|d| {
        bed.b
            .tags
            .iter()
            .any(|t| t == *d || t.split(':').next() == Some(d.as_str()))
    }) {
        return skip(owner, c, format!("excluded on {d}"));
    }
    let subject_text = match &c.kind {
        CheckKind::File { path, .. } => path.clone(),
        CheckKind::Command { command, .. } => command.clone(),
        CheckKind::Package { name, .. } | CheckKind::Service { name, .. } => name.clone(),
        CheckKind::Addr { addr, .. } => addr.clone(),
        CheckKind::Other { subject, .. } => {
            return skip(owner, c, format!("a {subject} check needs a deployment"));
        }
        CheckKind::Unsupported { plugin } => return skip(owner, c, unsupported_reason(plugin)),
    };
    if let Some(v) = deploy_only_var(&subject_text) {
        return skip(owner, c, format!("needs the deploy-time variable ${{{v}}}"));
    }
    let user = format!("{}:{}", u.uid, u.gid);
    let t = Instant::now();
    let duration = |key: &str| {
        c.definition
            .get(key)
            .and_then(|v| v.as_str())
            .and_then(parse_duration)
    };
    let eventually = duration("eventually").unwrap_or(match c.kind {
        // Services start asynchronously under the init.
        CheckKind::Service { .. } | CheckKind::Addr { .. } => Duration::from_secs(15),
        _ => Duration::ZERO,
    });
    let interval = duration("retry_interval").unwrap_or(Duration::from_millis(500));
    let timeout = duration("timeout").unwrap_or(Duration::from_secs(120));
    loop {
        let r = attempt(host, id, bed, &user, owner, c, timeout);
        if r.outcome != Outcome::Fail || t.elapsed() >= eventually {
            return CheckResult {
                duration_ms: t.elapsed().as_millis() as u64,
                ..r
            };
        }
        std::thread::sleep(interval);
    }
}

fn attempt(
    host: &dyn BedHost,
    id: &str,
    bed: &Bed<'_>,
    user: &str,
    owner: &str,
    c: &Check,
    timeout: Duration,
) -> CheckResult {
    let u = &bed.b.user;
    let exp = |s: &str| expand_user_vars(s, &u.name, &u.home);
    let fail = |reason: &str, expected: String, actual: String| CheckResult {
        id: c.id.clone(),
        owner: owner.to_string(),
        outcome: Outcome::Fail,
        reason: Some(reason.to_string()),
        expected: Some(expected),
        actual: Some(actual),
        duration_ms: 0,
    };
    let pass = || CheckResult {
        id: c.id.clone(),
        owner: owner.to_string(),
        outcome: Outcome::Pass,
        reason: None,
        expected: None,
        actual: None,
        duration_ms: 0,
    };
    let run = |script: &str| host.exec(id, user, script, timeout);
    match &c.kind {
        CheckKind::File {
            path,
            exists,
            mode,
            filetype,
            contains,
        } => {
            let path = exp(path);
            let out = match run(&format!(
                "stat -c '%F|%a' {} 2>/dev/null || echo missing",
                sh::quote(&path)
            )) {
                Ok(o) => o,
                Err(e) => return fail("could not run stat in the bed", "a result".into(), e),
            };
            let line = out.stdout.trim().to_string();
            let present = line != "missing";
            let want_present = exists.unwrap_or(true);
            if present != want_present {
                return fail(
                    "existence",
                    if want_present {
                        format!("{path} exists")
                    } else {
                        format!("{path} absent")
                    },
                    if present {
                        format!("{path} exists ({line})")
                    } else {
                        format!("{path} does not exist")
                    },
                );
            }
            if !present {
                return pass();
            }
            let (kind, actual_mode) = line.split_once('|').unwrap_or((&line, ""));
            if let Some(m) = mode {
                let want = m.trim_start_matches('0');
                if actual_mode.trim_start_matches('0') != want {
                    return fail("mode", format!("mode {m}"), format!("mode 0{actual_mode}"));
                }
            }
            if let Some(ft) = filetype {
                let ok = match ft.as_str() {
                    "directory" | "dir" => kind == "directory",
                    "file" | "regular" => kind.starts_with("regular"),
                    "symlink" | "link" => kind == "symbolic link",
                    other => kind == other,
                };
                if !ok {
                    return fail("file type", ft.clone(), kind.to_string());
                }
            }
            if !contains.is_empty() {
                let content = match run(&format!("cat {}", sh::quote(&path))) {
                    Ok(o) => o.stdout,
                    Err(e) => return fail("could not read the file", "its content".into(), e),
                };
                for want in contains {
                    if !content.contains(want.as_str()) {
                        let shown: String = content.chars().take(200).collect();
                        return fail("content", format!("contains {want:?}"), shown);
                    }
                }
            }
            pass()
        }
        CheckKind::Command {
            command,
            exit_status,
            stdout,
            stderr,
        } => {
            let script = format!(
                "export HOME={home} USER={user}; cd {home} 2>/dev/null || true; if command -v bash >/dev/null 2>&1; then exec bash -c {cmd}; else exec sh -c {cmd}; fi",
                home = sh::quote(&u.home),
                user = sh::quote(&u.name),
                cmd = sh::quote(&exp(command))
            );
            let out = match run(&script) {
                Ok(o) => o,
                Err(e) => return fail("could not run the command", "it to run".into(), e),
            };
            let want_status = exit_status.or(if stdout.is_empty() && stderr.is_empty() {
                Some(0)
            } else {
                None
            });
            if let Some(w) = want_status
                && i64::from(out.status) != w
            {
                let tail: String = out
                    .stderr
                    .chars()
                    .rev()
                    .take(300)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                return fail(
                    "exit status",
                    format!("exit status {w}"),
                    format!("exit status {} (stderr: {})", out.status, tail.trim()),
                );
            }
            for (stream, text, ms) in [
                ("stdout", &out.stdout, stdout),
                ("stderr", &out.stderr, stderr),
            ] {
                for m in ms {
                    let (ok, want) = match m {
                        Matcher::Contains(s) => (
                            text.contains(s.as_str()),
                            format!("{stream} contains {s:?}"),
                        ),
                        Matcher::Matches(r) => match regex::Regex::new(r) {
                            Ok(re) => (re.is_match(text), format!("{stream} matches /{r}/")),
                            Err(e) => {
                                return fail(
                                    "invalid regular expression",
                                    r.clone(),
                                    e.to_string(),
                                );
                            }
                        },
                    };
                    if !ok {
                        let shown: String = text.chars().take(300).collect();
                        return fail(stream, want, shown);
                    }
                }
            }
            pass()
        }
        CheckKind::Package {
            name,
            installed,
            package_map,
        } => {
            let pkg = bed
                .b
                .tags
                .iter()
                .find_map(|t| {
                    package_map
                        .get(t)
                        .or_else(|| package_map.get(t.split(':').next().unwrap_or("")))
                })
                .cloned()
                .unwrap_or_else(|| name.clone());
            let query = match bed.format.as_str() {
                "deb" => format!(
                    "dpkg-query -W -f='${{Status}}' {} 2>/dev/null | grep -q 'install ok installed'",
                    sh::quote(&pkg)
                ),
                "rpm" => format!("rpm -q {} >/dev/null 2>&1", sh::quote(&pkg)),
                "pac" => format!("pacman -Q {} >/dev/null 2>&1", sh::quote(&pkg)),
                other => return skip(owner, c, format!("no package query for format `{other}`")),
            };
            match run(&query) {
                Ok(o) if (o.status == 0) == *installed => pass(),
                Ok(o) => fail(
                    "package",
                    format!(
                        "{pkg} {}",
                        if *installed {
                            "installed"
                        } else {
                            "not installed"
                        }
                    ),
                    format!(
                        "{pkg} {}",
                        if o.status == 0 {
                            "installed"
                        } else {
                            "not installed"
                        }
                    ),
                ),
                Err(e) => fail("could not query packages", pkg, e),
            }
        }
        CheckKind::Service { name, running } => {
            if bed.init.is_none() {
                return skip(
                    owner,
                    c,
                    "the box runs no init in a bed (no services of its own)",
                );
            }
            match run(&format!(
                "supervisorctl -c /etc/supervisord.conf status {} 2>&1",
                sh::quote(name)
            )) {
                Ok(o) => {
                    let is_running = o.stdout.contains("RUNNING");
                    if is_running == *running {
                        pass()
                    } else {
                        fail(
                            "service",
                            format!(
                                "{name} {}",
                                if *running { "RUNNING" } else { "not running" }
                            ),
                            o.stdout.trim().to_string(),
                        )
                    }
                }
                Err(e) => fail("could not ask the init", name.clone(), e),
            }
        }
        CheckKind::Addr { addr, reachable } => {
            let Some((host_part, port)) = addr.rsplit_once(':') else {
                return fail("address", "host:port".into(), addr.clone());
            };
            let script = format!(
                "if command -v bash >/dev/null 2>&1; then bash -c 'exec 3<>/dev/tcp/{}/{}' 2>/dev/null; else nc -z {} {} 2>/dev/null; fi",
                host_part, port, host_part, port
            );
            match run(&script) {
                Ok(o) if (o.status == 0) == *reachable => pass(),
                Ok(_) => fail(
                    "address",
                    format!("{addr} {}", if *reachable { "reachable" } else { "closed" }),
                    format!("{addr} {}", if *reachable { "closed" } else { "reachable" }),
                ),
                Err(e) => fail("could not connect", addr.clone(), e),
            }
        }
        CheckKind::Other { subject, .. } => {
            skip(owner, c, format!("a {subject} check needs a deployment"))
        }
        CheckKind::Unsupported { plugin } => skip(owner, c, unsupported_reason(plugin)),
    }
}

/// Why a `plugin: <word>` check charly has no runner for is not run.
fn unsupported_reason(plugin: &str) -> String {
    format!("plugin `{plugin}` is not supported by charly: no runner for it, the check is not run")
}

/// JUnit XML for CI (one test suite per bed).
pub fn junit(reports: &[BedReport]) -> String {
    fn esc(s: &str) -> String {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    }
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n");
    for r in reports {
        let (p, f, s) = r.counts();
        let errors = usize::from(r.error.is_some());
        x.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{f}\" errors=\"{errors}\" skipped=\"{s}\">\n",
            esc(&r.box_name),
            p + f + s
        ));
        if let Some(e) = &r.error {
            x.push_str(&format!(
                "    <testcase name=\"bed\" classname=\"{}\"><error message=\"{}\"/></testcase>\n",
                esc(&r.box_name),
                esc(e)
            ));
        }
        for c in &r.checks {
            let class = format!("{}.{}", r.box_name, c.owner);
            x.push_str(&format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\">",
                esc(&c.id),
                esc(&class),
                c.duration_ms as f64 / 1000.0
            ));
            match c.outcome {
                Outcome::Pass => {}
                Outcome::Skip => x.push_str(&format!(
                    "<skipped message=\"{}\"/>",
                    esc(c.reason.as_deref().unwrap_or(""))
                )),
                Outcome::Fail => x.push_str(&format!(
                    "<failure message=\"{}\">expected: {}\nactual: {}</failure>",
                    esc(c.reason.as_deref().unwrap_or("")),
                    esc(c.expected.as_deref().unwrap_or("")),
                    esc(c.actual.as_deref().unwrap_or(""))
                )),
            }
            x.push_str("</testcase>\n");
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn junit_escapes_and_counts() {
        let r = BedReport {
            box_name: "b".into(),
            cached: false,
            error: None,
            checks: vec![
                CheckResult {
                    id: "ok".into(),
                    owner: "candy:a".into(),
                    outcome: Outcome::Pass,
                    reason: None,
                    expected: None,
                    actual: None,
                    duration_ms: 5,
                },
                CheckResult {
                    id: "bad<1>".into(),
                    owner: "candy:a".into(),
                    outcome: Outcome::Fail,
                    reason: Some("mode".into()),
                    expected: Some("mode 0755".into()),
                    actual: Some("mode 0644".into()),
                    duration_ms: 5,
                },
                CheckResult {
                    id: "s".into(),
                    owner: "box:b".into(),
                    outcome: Outcome::Skip,
                    reason: Some("deploy & co".into()),
                    expected: None,
                    actual: None,
                    duration_ms: 0,
                },
            ],
        };
        let x = junit(&[r]);
        assert!(x.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""));
        assert!(x.contains("name=\"bad&lt;1&gt;\""));
        assert!(x.contains("expected: mode 0755\nactual: mode 0644"));
        assert!(x.contains("<skipped message=\"deploy &amp; co\"/>"));
    }
}
