//! Typos fail (issue 44, item 2): a misspelt field of a candy is an error
//! of `validate` and of `box build` (exit 1, at file:line:col, with the
//! field it probably meant), unless unknown fields are allowed; an `eval:`
//! typo (a matcher or a subject) is an error when the project loads, not
//! when a bed runs; `validate --strict` fails on warnings.

use assert_cmd::Command;
use std::path::PathBuf;

struct World {
    _t: tempfile::TempDir,
    project: PathBuf,
    cache: PathBuf,
}

fn world(candy: &str) -> World {
    let t = tempfile::tempdir().expect("tmp");
    let project = t.path().join("project");
    charly_testutil::copy_project(&charly_testutil::example(), &project);
    let dir = project.join("candy/typo");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("charly.yml"), candy).expect("candy");
    std::fs::create_dir_all(project.join("box/typo")).expect("box");
    std::fs::write(
        project.join("box/typo/charly.yml"),
        "box:\n    name: typo\n    version: 2026.12.1\n    base: base\n    candy:\n        - typo\n",
    )
    .expect("box");
    World {
        cache: t.path().join("cache"),
        _t: t,
        project,
    }
}

impl World {
    fn run(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = Command::cargo_bin("charly")
            .expect("binary")
            .env("NO_COLOR", "1")
            .env("CHARLY_CACHE_DIR", &self.cache)
            .env_remove("CHARLY_ALLOW_UNKNOWN_FIELDS")
            .arg("-C")
            .arg(&self.project)
            .args(args)
            .output()
            .expect("run");
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn settings(&self, text: &str) {
        let d = self.project.join(".charly");
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(d.join("settings.yml"), text).expect("settings");
    }
}

const BUILD: &[&str] = &["box", "build", "typo", "--runner", "fake"];

#[test]
fn a_misspelt_field_fails_validate_and_build_unless_allowed() {
    let w = world(
        "candy:\n    version: 2026.12.1\n    name: typo\n    pacakge:\n        - curl\n        - jq\n",
    );
    for args in [&["validate"][..], BUILD] {
        let (code, said) = w.run(args);
        assert_eq!(code, Some(1), "{args:?}: {said}");
        assert!(
            said.contains("candy/typo/charly.yml:4:5"),
            "{args:?}: {said}"
        );
        assert!(said.contains("unknown field `pacakge`"), "{args:?}: {said}");
        assert!(said.contains("did you mean `package`?"), "{args:?}: {said}");
    }
    // Allowed: a warning, and the build goes on.
    let (code, said) = w.run(&["--allow-unknown-fields", "validate"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("it is ignored"), "{said}");
    let mut build = vec!["--allow-unknown-fields"];
    build.extend(BUILD);
    let (code, said) = w.run(&build);
    assert_eq!(code, Some(0), "{said}");
    // `validate --strict` fails on that warning.
    let (code, said) = w.run(&["--allow-unknown-fields", "validate", "--strict"]);
    assert_eq!(code, Some(1), "{said}");
    // The same from the project's settings, and `=false` on the command line.
    w.settings("allow_unknown_fields: true\n");
    let (code, said) = w.run(&["validate"]);
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = w.run(&["--allow-unknown-fields=false", "validate"]);
    assert_eq!(code, Some(1), "{said}");
}

#[test]
fn an_eval_typo_is_a_load_error_at_its_place() {
    let w = world(
        "candy:\n    version: 2026.12.1\n    name: typo\n    eval:\n        - id: a\n          \
         file: /etc/hostname\n          contians: [x]\n        - id: b\n          fiel: /y\n",
    );
    for args in [&["validate"][..], BUILD] {
        let (code, said) = w.run(args);
        assert_eq!(code, Some(1), "{args:?}: {said}");
        assert!(
            said.contains("candy/typo/charly.yml:7:11") && said.contains("`contians`"),
            "{args:?}: {said}"
        );
        assert!(
            said.contains("candy/typo/charly.yml:8:11") && said.contains("did you mean `file`?"),
            "{args:?}: {said}"
        );
    }
}
