//! Interop with a real go-plugin plugin (HashiCorp go-plugin's own AutoMTLS:
//! ECDSA P-521 certificates, Go's TLS stack verifying charly's), built from
//! `tests/goplugin/main.go` with Debian's Go packages by
//! `.ci/build-goplugin` (`.ci/install` runs it) into `.ci/goplugin/goplug`,
//! or named by `CHARLY_GO_PLUGIN`. Without the build the test fails (under
//! CI always; elsewhere unless `CHARLY_SKIP_GO_PLUGIN=1`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use charly_plugin::{Capture, ExecError, Executor, Plugin, PluginOptions};
use serde_json::json;

struct Venue(Arc<Mutex<u32>>);

impl Executor for Venue {
    fn venue(&mut self) -> Result<String, ExecError> {
        *self.0.lock().expect("count") += 1;
        Ok("from-charly".into())
    }
    fn run_system(&mut self, _: &str, _: &[u8]) -> Result<(), ExecError> {
        Ok(())
    }
    fn run_user(&mut self, _: &str, _: &[u8]) -> Result<(), ExecError> {
        Ok(())
    }
    fn run_capture(&mut self, _: &str, _: &[u8]) -> Result<Capture, ExecError> {
        Ok(Capture::default())
    }
    fn put_file(&mut self, _: &str, _: &[u8], _: u32, _: bool, _: &[u8]) -> Result<(), ExecError> {
        Ok(())
    }
    fn get_file(&mut self, _: &str, _: bool, _: &[u8]) -> Result<Vec<u8>, ExecError> {
        Ok(Vec::new())
    }
}

/// The Go build: `CHARLY_GO_PLUGIN`, else what `.ci/build-goplugin` made.
fn go_plugin() -> Option<PathBuf> {
    let exe = std::env::var_os("CHARLY_GO_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| charly_testutil::workspace().join(".ci/goplugin/goplug"));
    (exe.is_file()
        || charly_testutil::missing_tool(
            "the Go go-plugin build",
            "CHARLY_SKIP_GO_PLUGIN",
            "run .ci/build-goplugin",
        ))
    .then_some(exe)
}

#[test]
fn a_go_plugin_with_automtls() {
    let Some(exe) = go_plugin() else {
        return;
    };
    let p = Plugin::start(&exe, PluginOptions::default()).expect("the Go plugin starts");
    assert!(p.mutual_tls(), "go-plugin answered without a certificate");
    let pid = p.pid().expect("pid");
    assert_eq!(p.describe().expect("describe").calver, "go-plugin-interop");
    let calls = Arc::new(Mutex::new(0));
    let v = p
        .invoke(
            "step",
            "x",
            "execute",
            &json!({}),
            &json!({}),
            Some(&mut Venue(calls.clone())),
        )
        .expect("the Go plugin dials the host's executor over the broker (TLS)");
    assert_eq!(v["venue"], "from-charly", "{v}");
    assert_eq!(v["tls"], "true", "{v}");
    assert_eq!(*calls.lock().expect("count"), 1);
    // It serves no InvokeStream: grpc-go's UNIMPLEMENTED, then Invoke.
    let v = p
        .invoke_stream("step", "x", "execute", &json!({}), &json!({}), None)
        .expect("falls back to Invoke");
    assert_eq!(v["tls"], "true", "{v}");
    // Plaintext when the host does not offer AutoMTLS.
    let plain = Plugin::start(
        &exe,
        PluginOptions {
            auto_mtls: false,
            ..PluginOptions::default()
        },
    )
    .expect("starts without AutoMTLS");
    assert!(!plain.mutual_tls());
    assert_eq!(
        plain.describe().expect("describe").calver,
        "go-plugin-interop"
    );
    drop(plain);
    drop(p);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the Go plugin outlived its Plugin"
    );
}
