//! The host against real plugin processes: the example step plugin and the
//! fault plugin (both built from this crate).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use charly_plugin::reply::{DeployReply, EmitReply, REVERSE_OP_PLUGIN_SCRIPT};
use charly_plugin::{
    Capture, ExecError, Executor, Plugin, PluginError, PluginOptions, StepContract, StepVenue,
};
use serde_json::json;

const EXAMPLE: &str = env!("CARGO_BIN_EXE_charly-plugin-example");
const FAULT: &str = env!("CARGO_BIN_EXE_charly-plugin-fault");
const HOLD: &str = env!("CARGO_BIN_EXE_charly-plugin-hold");

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Running: its /proc entry is there and it is not a zombie (an orphan
/// whose new parent does not reap it stays a zombie, yet it has ended).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

fn start_example() -> Plugin {
    Plugin::start(Path::new(EXAMPLE), PluginOptions::default()).expect("example plugin starts")
}

/// Options for the fault plugin in `mode`, writing its pid to `pidfile`.
fn fault_opts(mode: &str, pidfile: &Path) -> PluginOptions {
    PluginOptions {
        name: Some(format!("fault-{mode}")),
        env: vec![
            ("CHARLY_PLUGIN_FAULT".into(), mode.into()),
            ("CHARLY_PLUGIN_FAULT_PIDFILE".into(), pidfile.into()),
        ],
        handshake_timeout: Duration::from_secs(5),
        call_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::from_millis(500),
        ..PluginOptions::default()
    }
}

fn pid_from(pidfile: &Path) -> u32 {
    std::fs::read_to_string(pidfile)
        .expect("the fault plugin wrote its pid")
        .trim()
        .parse()
        .expect("a pid")
}

#[test]
fn handshake_and_describe_round_trip() {
    let p = start_example();
    let pid = p.pid().expect("a pid");
    assert!(alive(pid));
    let caps = p.describe().expect("describe");
    assert_eq!(caps.calver, "2026.182.0900");
    assert_eq!(caps.protocol_version, 1);
    assert_eq!(caps.provided.len(), 1);
    let c = &caps.provided[0];
    assert_eq!(
        (c.class.as_str(), c.word.as_str()),
        ("step", "examplestepkind")
    );
    assert_eq!(c.input_def, "#ExamplestepkindInput");
    assert_eq!(
        c.step_contract,
        Some(StepContract {
            scope: "user".into(),
            venue: StepVenue::HostNative,
            gate: String::new(),
            emits: true,
        })
    );
    assert!(caps.schema_cue.contains("#ExamplestepkindInput"));
    drop(p);
    // Shut down (GRPCController.Shutdown) and reaped.
    assert!(!alive(pid), "plugin {pid} still there after drop");
}

#[test]
fn emit_returns_the_fragment() {
    let p = start_example();
    let v = p
        .invoke(
            "step",
            "examplestepkind",
            "emit",
            &json!({"marker": "it's baked"}),
            &json!({"distros": ["debian"]}),
            None,
        )
        .expect("emit");
    let r: EmitReply = serde_json::from_value(v).expect("an EmitReply");
    assert_eq!(
        r.fragment,
        "RUN mkdir -p /etc && printf '%s\\n' 'it'\\''s baked' > /etc/examplestepkind-build-baked\n"
    );
}

/// Records every call; writes nothing.
#[derive(Default)]
struct Recorder {
    calls: Vec<String>,
}

impl Executor for Recorder {
    fn venue(&mut self) -> Result<String, ExecError> {
        self.calls.push("venue".into());
        Ok("test".into())
    }
    fn run_system(&mut self, script: &str, _: &[u8]) -> Result<(), ExecError> {
        self.calls.push(format!("system: {script}"));
        Ok(())
    }
    fn run_user(&mut self, script: &str, _: &[u8]) -> Result<(), ExecError> {
        self.calls.push(format!("user: {script}"));
        Ok(())
    }
    fn run_capture(&mut self, script: &str, _: &[u8]) -> Result<Capture, ExecError> {
        self.calls.push(format!("capture: {script}"));
        Ok(Capture {
            stdout: format!("ran {script}"),
            stderr: "warn".into(),
            exit_code: 3,
        })
    }
    fn put_file(
        &mut self,
        path: &str,
        _: &[u8],
        mode: u32,
        root: bool,
        _: &[u8],
    ) -> Result<(), ExecError> {
        self.calls.push(format!("put: {path} {mode:o} {root}"));
        Ok(())
    }
    fn get_file(&mut self, path: &str, _: bool, _: &[u8]) -> Result<Vec<u8>, ExecError> {
        self.calls.push(format!("get: {path}"));
        Err(ExecError("absent".into()))
    }
}

#[test]
fn execute_drives_the_host_executor_and_returns_a_reverse_op() {
    let p = start_example();
    let mut rec = Recorder::default();
    // Twice: each invoke gets its own broker id and connection.
    for marker in ["first", "second"] {
        let v = p
            .invoke(
                "step",
                "examplestepkind",
                "execute",
                &json!({ "marker": marker }),
                &serde_json::Value::Null,
                Some(&mut rec),
            )
            .expect("execute");
        let r: DeployReply = serde_json::from_value(v).expect("a DeployReply");
        assert_eq!(r.record.candy, "plugin-example-stepkind");
        assert_eq!(r.record.version, "2026.182.0900");
        assert_eq!(r.reverse_ops.len(), 1);
        let op = &r.reverse_ops[0];
        assert_eq!(op.kind, REVERSE_OP_PLUGIN_SCRIPT);
        assert_eq!(op.scope, "user");
        assert_eq!(op.script(), Some("rm -rf /tmp/charly-examplestepkind"));
    }
    assert_eq!(
        rec.calls,
        [
            "user: mkdir -p /tmp/charly-examplestepkind && printf '%s\\n' 'first' > /tmp/charly-examplestepkind/marker",
            "user: mkdir -p /tmp/charly-examplestepkind && printf '%s\\n' 'second' > /tmp/charly-examplestepkind/marker",
        ]
    );
}

/// An executor error goes back to the plugin, which fails the invoke with it.
#[test]
fn an_executor_error_reaches_the_plugin() {
    struct Failing;
    impl Executor for Failing {
        fn venue(&mut self) -> Result<String, ExecError> {
            Ok("x".into())
        }
        fn run_system(&mut self, _: &str, _: &[u8]) -> Result<(), ExecError> {
            Ok(())
        }
        fn run_user(&mut self, _: &str, _: &[u8]) -> Result<(), ExecError> {
            Err(ExecError("disk full".into()))
        }
        fn run_capture(&mut self, _: &str, _: &[u8]) -> Result<Capture, ExecError> {
            Ok(Capture::default())
        }
        fn put_file(
            &mut self,
            _: &str,
            _: &[u8],
            _: u32,
            _: bool,
            _: &[u8],
        ) -> Result<(), ExecError> {
            Ok(())
        }
        fn get_file(&mut self, _: &str, _: bool, _: &[u8]) -> Result<Vec<u8>, ExecError> {
            Ok(Vec::new())
        }
    }
    let p = start_example();
    let e = p
        .invoke(
            "step",
            "examplestepkind",
            "execute",
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            Some(&mut Failing),
        )
        .expect_err("the plugin fails");
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            PluginError::Rpc {
                code: tonic::Code::Aborted,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("invoke step:examplestepkind execute"), "{msg}");
    assert!(msg.contains("disk full"), "{msg}");
}

#[test]
fn a_plugin_that_exits_before_its_handshake() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let e = Plugin::start(Path::new(FAULT), fault_opts("exit-early", &pidfile))
        .expect_err("no handshake");
    let msg = e.to_string();
    assert!(
        matches!(e, PluginError::ExitedBeforeHandshake { .. }),
        "{msg}"
    );
    assert!(msg.contains("plugin fault-exit-early"), "{msg}");
    assert!(msg.contains("exit status: 3"), "{msg}");
    assert!(msg.contains("giving up before the handshake"), "{msg}");
    assert!(!alive(pid_from(&pidfile)));
}

#[test]
fn a_bad_handshake_line_is_quoted_and_the_plugin_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let e = Plugin::start(Path::new(FAULT), fault_opts("bad-handshake", &pidfile))
        .expect_err("bad handshake");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::BadHandshake { .. }), "{msg}");
    assert!(msg.contains("plugin fault-bad-handshake"), "{msg}");
    assert!(
        msg.contains("hello from a plugin that does not speak go-plugin"),
        "{msg}"
    );
    assert!(!alive(pid_from(&pidfile)), "the plugin was left running");
}

#[test]
fn no_handshake_in_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let opts = PluginOptions {
        handshake_timeout: Duration::from_millis(500),
        ..fault_opts("no-handshake", &pidfile)
    };
    let e = Plugin::start(Path::new(FAULT), opts).expect_err("timeout");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::HandshakeTimeout { .. }), "{msg}");
    assert!(msg.contains("plugin fault-no-handshake"), "{msg}");
    assert!(!alive(pid_from(&pidfile)), "the plugin was left running");
}

#[test]
fn a_crash_during_invoke() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&lines);
    let opts = PluginOptions {
        sink: Some(Arc::new(move |l: &str| {
            if let Ok(mut v) = seen.lock() {
                v.push(l.to_string());
            }
        })),
        ..fault_opts("crash", &pidfile)
    };
    let p = Plugin::start(Path::new(FAULT), opts).expect("starts");
    let e = p
        .invoke("verb", "x", "run", &json!({}), &json!({}), None)
        .expect_err("crash");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::Crashed { .. }), "{msg}");
    assert!(
        msg.contains("plugin fault-crash: crashed during invoke verb:x run"),
        "{msg}"
    );
    assert!(msg.contains("exit status: 101"), "{msg}");
    assert!(msg.contains("fault: crashing in invoke"), "{msg}");
    let pid = pid_from(&pidfile);
    assert!(!alive(pid));
    drop(p);
    assert!(
        lines
            .lock()
            .expect("lines")
            .iter()
            .any(|l| l == "fault-crash: fault: crashing in invoke"),
        "{:?}",
        lines.lock().map(|l| l.clone())
    );
}

#[test]
fn a_hanging_invoke_times_out_and_the_plugin_is_reaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let opts = PluginOptions {
        call_timeout: Duration::from_millis(700),
        ..fault_opts("hang", &pidfile)
    };
    let p = Plugin::start(Path::new(FAULT), opts).expect("starts");
    let e = p
        .invoke("deploy", "x", "execute", &json!({}), &json!({}), None)
        .expect_err("hang");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::Timeout { .. }), "{msg}");
    assert_eq!(
        msg,
        "plugin fault-hang: invoke deploy:x execute timed out after 700ms"
    );
    let pid = pid_from(&pidfile);
    assert!(alive(pid));
    drop(p);
    assert!(!alive(pid), "the plugin was left running");
}

#[test]
fn a_reply_that_is_not_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let p = Plugin::start(Path::new(FAULT), fault_opts("garbage", &pidfile)).expect("starts");
    let e = p
        .invoke("verb", "x", "run", &json!({}), &json!({}), None)
        .expect_err("garbage");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::BadReply { .. }), "{msg}");
    assert!(
        msg.contains("plugin fault-garbage: invoke verb:x run answered garbage"),
        "{msg}"
    );
    assert!(msg.contains("this is {not json"), "{msg}");
    let pid = pid_from(&pidfile);
    drop(p);
    assert!(!alive(pid));
}

#[test]
fn a_missing_executable_is_named() {
    let e = Plugin::start(
        Path::new("/nonexistent/charly-plugin-x"),
        PluginOptions::default(),
    )
    .expect_err("no such file");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::Spawn { .. }), "{msg}");
    assert!(
        msg.starts_with("plugin charly-plugin-x: cannot start /nonexistent/charly-plugin-x"),
        "{msg}"
    );
}

/// A plugin that ignores `GRPCController.Shutdown` is killed after the grace.
#[test]
fn a_plugin_that_ignores_shutdown_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let p = Plugin::start(Path::new(FAULT), fault_opts("stubborn", &pidfile)).expect("starts");
    p.describe().expect("describe");
    let pid = pid_from(&pidfile);
    let t = std::time::Instant::now();
    drop(p);
    assert!(!alive(pid), "the plugin was left running");
    // Shutdown answered, then the grace (500 ms) ran out, then the kill.
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// Every ExecutorService RPC reaches the executor (or, for the host-engine
/// ones, answers that this host does not support it).
#[test]
fn every_executor_rpc_reaches_the_executor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let (url, requests) = http_server();
    let mut opts = fault_opts("callbacks", &pidfile);
    opts.env
        .push(("CHARLY_PLUGIN_FAULT_URL".into(), url.into()));
    let p = Plugin::start(Path::new(FAULT), opts).expect("starts");
    let mut rec = Recorder::default();
    let v = p
        .invoke(
            "deploy",
            "x",
            "execute",
            &json!({}),
            &json!({}),
            Some(&mut rec),
        )
        .expect("invoke");
    assert_eq!(
        rec.calls,
        [
            "venue",
            "system: id -u",
            "capture: echo hi",
            "put: /etc/x 640 true",
            "get: /etc/y",
        ]
    );
    assert_eq!(v["venue"], "test");
    assert_eq!(v["system"], "");
    assert_eq!(v["capture"], json!(["ran echo hi", "warn", 3, ""]));
    assert_eq!(v["put"], "");
    assert_eq!(v["get"], json!(["", "absent"]));
    for k in ["host_step", "host_build", "host_arbiter", "invoke_provider"] {
        let text = v[k].as_str().unwrap_or_default();
        assert!(text.contains("not supported by this host"), "{k}: {text}");
    }
    assert!(
        v["invoke_provider"]
            .as_str()
            .is_some_and(|t| t.starts_with("Unimplemented")),
        "{}",
        v["invoke_provider"]
    );
    // CheckContextService on the same broker connection: HTTPDo from the
    // host (redirect followed, or answered), AddBackground refused.
    assert_eq!(v["http"][0], 200, "{}", v["http"]);
    assert_eq!(v["http"][1], "final", "{}", v["http"]);
    let blob = v["http"][2].as_str().unwrap_or_default();
    assert!(blob.contains("X-Charly: yes\n"), "{blob:?}");
    assert!(blob.contains("Content-Length: 5\n"), "{blob:?}");
    assert_eq!(v["http"][3], "");
    assert_eq!(v["http_no_follow"][0], 302, "{}", v["http_no_follow"]);
    assert_eq!(v["http_no_follow"][3], "");
    assert_eq!(v["http_bad_ca"][0], 0);
    assert_eq!(v["http_bad_ca"][3], "no certs parsed from CA PEM");
    let add = v["add_background"].as_str().unwrap_or_default();
    assert!(
        add.starts_with("Unimplemented: AddBackground (pid 42) is not supported by this host"),
        "{add}"
    );
    let seen = requests.lock().expect("requests").clone();
    assert!(
        seen.iter().any(|r| r.starts_with("POST /redirect ")
            && r.contains("x-asked: yes")
            && r.ends_with("ping")),
        "{seen:?}"
    );
}

/// A one-thread HTTP server on 127.0.0.1: `/redirect` answers 302 to
/// `/final`, which answers 200 `final` with `X-Charly: yes`. Returns its
/// base URL and the requests it saw (head lowercased, then the body).
fn http_server() -> (String, Arc<Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                let Ok(n) = c.read(&mut chunk) else {
                    break None;
                };
                if n == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i + 4);
                }
            };
            let Some(head_end) = head_end else { continue };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + len {
                let Ok(n) = c.read(&mut chunk) else { break };
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = String::from_utf8_lossy(&buf[head_end..]).into_owned();
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            if let Ok(mut v) = log.lock() {
                v.push(format!("{head}{body}").replacen("post /", "POST /", 1));
            }
            let resp = if path == "/redirect" {
                "HTTP/1.1 302 Found\r\nLocation: /final\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
            } else {
                "HTTP/1.1 200 OK\r\nX-Charly: yes\r\nContent-Length: 5\r\nConnection: close\r\n\r\nfinal".to_string()
            };
            let _ = c.write_all(resp.as_bytes());
        }
    });
    (url, seen)
}

/// Two threads invoking one plugin at once.
#[test]
fn concurrent_invokes() {
    let p = start_example();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let p = &p;
                s.spawn(move || {
                    let mut rec = Recorder::default();
                    let v = p
                        .invoke(
                            "step",
                            "examplestepkind",
                            "execute",
                            &json!({ "marker": format!("m{i}") }),
                            &serde_json::Value::Null,
                            Some(&mut rec),
                        )
                        .expect("execute");
                    assert!(v["reverse_ops"].is_array());
                    assert_eq!(rec.calls.len(), 1);
                    assert!(rec.calls[0].contains(&format!("'m{i}'")), "{:?}", rec.calls);
                })
            })
            .collect();
        for h in hs {
            h.join().expect("thread");
        }
    });
}

/// A plugin listening on TCP (go-plugin's other network), in the port range
/// the host passed.
#[test]
fn a_tcp_plugin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let opts = PluginOptions {
        port_range: (23000, 23999),
        ..fault_opts("tcp", &pidfile)
    };
    let p = Plugin::start(Path::new(FAULT), opts).expect("starts over tcp");
    assert_eq!(p.describe().expect("describe").calver, "0");
    let pid = pid_from(&pidfile);
    // No GRPCController: the shutdown fails, the grace runs out, the kill.
    drop(p);
    assert!(!alive(pid), "the plugin was left running");
}

/// charly SIGKILLed: no drop, no Shutdown runs, yet the plugin goes (the
/// kernel's parent-death signal). The stand-in for charly started it on a
/// thread that ended first, and the plugin kept serving until then. The
/// killed host cannot remove its socket directory: it goes in this test's.
#[test]
fn the_plugin_dies_with_a_sigkilled_charly() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut hold = std::process::Command::new(HOLD)
        .arg(EXAMPLE)
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the stand-in starts");
    let mut line = String::new();
    std::io::BufReader::new(hold.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let Ok(pid) = line.trim().parse::<u32>() else {
        let _ = hold.kill();
        let out = hold.wait_with_output().expect("wait");
        panic!(
            "the stand-in printed no pid ({line:?}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    assert!(running(pid), "plugin {pid} is not running");
    hold.kill().expect("SIGKILL");
    hold.wait().expect("reaped");
    let t = std::time::Instant::now();
    while running(pid) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !running(pid),
        "plugin {pid} outlived its SIGKILLed host by {:?}",
        t.elapsed()
    );
}

/// Collects what reaches a sink.
fn collecting_sink() -> (charly_plugin::LineSink, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&lines);
    let sink: charly_plugin::LineSink = Arc::new(move |l: &str| {
        if let Ok(mut v) = seen.lock() {
            v.push(l.to_string());
        }
    });
    (sink, lines)
}

/// InvokeStream: the progress frames reach the sink (a string frame as its
/// text, an object as JSON), the last frame is the result and is not shown.
#[test]
fn execute_streams_progress_to_the_sink_and_returns_the_last_frame() {
    let (sink, lines) = collecting_sink();
    let p = Plugin::start(
        Path::new(EXAMPLE),
        PluginOptions {
            name: Some("ex".into()),
            sink: Some(sink),
            ..PluginOptions::default()
        },
    )
    .expect("starts");
    let mut rec = Recorder::default();
    let v = p
        .invoke_stream(
            "step",
            "examplestepkind",
            "execute",
            &json!({"marker": "streamed"}),
            &serde_json::Value::Null,
            Some(&mut rec),
        )
        .expect("execute streamed");
    let r: DeployReply = serde_json::from_value(v).expect("a DeployReply");
    assert_eq!(r.reverse_ops.len(), 1);
    assert_eq!(rec.calls.len(), 1, "{:?}", rec.calls);
    assert!(rec.calls[0].contains("'streamed'"), "{:?}", rec.calls);
    let shown = lines.lock().expect("lines").clone();
    assert_eq!(
        shown,
        [
            "ex: examplestepkind: writing the marker",
            r#"ex: {"examplestepkind":"marker written"}"#,
        ]
    );
    // A unary op streams its reply as the one frame.
    let v = p
        .invoke_stream(
            "step",
            "examplestepkind",
            "emit",
            &json!({}),
            &json!({}),
            None,
        )
        .expect("emit streamed");
    assert!(
        v["fragment"]
            .as_str()
            .is_some_and(|f| f.starts_with("RUN "))
    );
    assert_eq!(lines.lock().expect("lines").len(), 2, "nothing more shown");
}

/// A plugin that serves only Invoke: InvokeStream falls back to it.
#[test]
fn a_plugin_without_invoke_stream_is_invoked_instead() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let p = Plugin::start(Path::new(FAULT), fault_opts("plain", &pidfile)).expect("starts");
    for _ in 0..2 {
        let v = p
            .invoke_stream("step", "x", "execute", &json!({}), &json!({}), None)
            .expect("falls back to invoke");
        assert_eq!(v, json!({"ok": true}));
    }
}

/// The streaming call's failures are typed as the unary call's are.
#[test]
fn invoke_stream_failures_are_typed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let start = |mode: &str| {
        let pidfile = dir.path().join(mode);
        let opts = PluginOptions {
            call_timeout: Duration::from_millis(700),
            ..fault_opts(mode, &pidfile)
        };
        Plugin::start(Path::new(FAULT), opts).expect("starts")
    };
    let call = |p: &Plugin| p.invoke_stream("verb", "x", "record", &json!({}), &json!({}), None);

    let e = call(&start("crash")).expect_err("crash");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::Crashed { .. }), "{msg}");
    assert!(
        msg.contains("crashed during invoke-stream verb:x record"),
        "{msg}"
    );
    assert!(msg.contains("fault: crashing in invoke-stream"), "{msg}");

    let e = call(&start("hang")).expect_err("hang");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::Timeout { .. }), "{msg}");
    assert_eq!(
        msg,
        "plugin fault-hang: invoke-stream verb:x record timed out after 700ms"
    );

    let e = call(&start("garbage")).expect_err("garbage");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::BadReply { .. }), "{msg}");
    assert!(msg.contains("this is {not json"), "{msg}");

    let e = call(&start("empty-stream")).expect_err("no frame");
    let msg = e.to_string();
    assert!(matches!(e, PluginError::BadReply { .. }), "{msg}");
    assert!(msg.contains("the stream ended without a frame"), "{msg}");
}

/// Options for the fault plugin in `mode` with AutoMTLS side `tls`.
fn fault_tls_opts(mode: &str, tls: &str, pidfile: &Path) -> PluginOptions {
    let mut o = fault_opts(mode, pidfile);
    o.name = Some(format!("fault-{tls}"));
    o.env.push(("CHARLY_PLUGIN_FAULT_TLS".into(), tls.into()));
    o
}

fn example_with_tls(tls: &str) -> Plugin {
    Plugin::start(
        Path::new(EXAMPLE),
        PluginOptions {
            env: vec![("CHARLY_PLUGIN_EXAMPLE_TLS".into(), tls.into())],
            ..PluginOptions::default()
        },
    )
    .expect("example plugin starts")
}

/// AutoMTLS for real: the example plugin answers with its certificate
/// (P-256, P-384); Describe, a streamed execute whose executor is served
/// over TLS on the broker, and a unary emit all work. A plugin without
/// AutoMTLS (5 handshake fields) is spoken to in plaintext.
#[test]
fn automtls_with_the_example_plugin_and_plaintext_without() {
    for (tls, mutual) in [("p256", true), ("p384", true), ("off", false)] {
        let p = example_with_tls(tls);
        assert_eq!(p.mutual_tls(), mutual, "{tls}");
        assert_eq!(p.describe().expect("describe").calver, "2026.182.0900");
        let mut rec = Recorder::default();
        let v = p
            .invoke_stream(
                "step",
                "examplestepkind",
                "execute",
                &json!({"marker": tls}),
                &serde_json::Value::Null,
                Some(&mut rec),
            )
            .expect("execute over the broker");
        assert!(v["reverse_ops"].is_array(), "{tls}: {v}");
        assert_eq!(rec.calls.len(), 1, "{tls}: {:?}", rec.calls);
        let v = p
            .invoke(
                "step",
                "examplestepkind",
                "emit",
                &json!({}),
                &json!({}),
                None,
            )
            .expect("emit");
        assert!(v["fragment"].is_string(), "{tls}");
    }
    // Without AutoMTLS the host passes no certificate: plaintext.
    let p = Plugin::start(
        Path::new(EXAMPLE),
        PluginOptions {
            auto_mtls: false,
            ..PluginOptions::default()
        },
    )
    .expect("starts");
    assert!(!p.mutual_tls());
    p.describe().expect("describe");
}

/// A plugin that does AutoMTLS as a Go plugin does: ECDSA P-521. The host
/// verifies its TLS signatures (ring cannot; the p521 verifier does), as
/// server and, on the broker connection the plugin dials back, as client.
#[test]
fn a_go_style_p521_plugin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let p = Plugin::start(
        Path::new(FAULT),
        fault_tls_opts("callbacks", "p521", &pidfile),
    )
    .expect("a P-521 plugin starts");
    assert!(p.mutual_tls());
    assert_eq!(p.describe().expect("describe").calver, "0");
    let mut rec = Recorder::default();
    let v = p
        .invoke(
            "deploy",
            "x",
            "execute",
            &json!({}),
            &json!({}),
            Some(&mut rec),
        )
        .expect("the plugin dials the host's executor over TLS");
    assert_eq!(v["venue"], "test");
    assert_eq!(rec.calls.len(), 5, "{:?}", rec.calls);
}

/// Certificates the host cannot use are typed errors, and the plugin is
/// killed: not base64, a curve it cannot verify (named), a served
/// certificate other than the announced one, one it did not ask for.
#[test]
fn bad_automtls_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let start = |tls: &str, opts: fn(PluginOptions) -> PluginOptions| {
        let pidfile = dir.path().join(tls);
        let e = Plugin::start(
            Path::new(FAULT),
            opts(fault_tls_opts("plain", tls, &pidfile)),
        )
        .expect_err(tls);
        assert!(
            !alive(pid_from(&pidfile)),
            "{tls}: the plugin was left running"
        );
        e
    };
    let same = |o: PluginOptions| o;

    let e = start("garbage-cert", same);
    let msg = e.to_string();
    assert!(matches!(e, PluginError::BadCertificate { .. }), "{msg}");
    assert!(
        msg.starts_with(
            "plugin fault-garbage-cert: bad AutoMTLS certificate in its handshake: not base64"
        ),
        "{msg}"
    );

    let e = start("secp256k1-cert", same);
    let msg = e.to_string();
    assert!(matches!(e, PluginError::BadCertificate { .. }), "{msg}");
    assert!(
        msg.contains(
            "its key is ECDSA on curve secp256k1 (1.3.132.0.10), which this host cannot verify"
        ),
        "{msg}"
    );

    let e = start("wrong-cert", same);
    let msg = e.to_string();
    assert!(matches!(e, PluginError::Connect { .. }), "{msg}");
    assert!(msg.contains("(mutual TLS)"), "{msg}");

    let e = start("garbage-cert", |o| PluginOptions {
        auto_mtls: false,
        ..o
    });
    let msg = e.to_string();
    assert!(matches!(e, PluginError::Unsupported { .. }), "{msg}");
    assert!(
        msg.contains("when the host did not offer AutoMTLS"),
        "{msg}"
    );
}

/// Issue 43, finding 9: what a plugin starts (a shell plugin's commands)
/// is stopped with it, whether the plugin shuts down when asked or has to
/// be killed: its whole process group goes.
#[test]
fn a_plugins_children_are_stopped_with_it() {
    for (mode, target) in [("", EXAMPLE), ("stubborn", FAULT)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let childfile = dir.path().join("child");
        let script = dir.path().join("plugin.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nsleep 300 &\necho $! > '{}'\nexec '{}' \"$@\"\n",
                childfile.display(),
                target
            ),
        )
        .expect("script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let opts = if mode.is_empty() {
            PluginOptions::default()
        } else {
            fault_opts(mode, &dir.path().join("pid"))
        };
        let p = Plugin::start(&script, opts).expect("starts");
        p.describe().expect("describe");
        let child = pid_from(&childfile);
        assert!(
            running(child),
            "{mode:?}: the child runs while the plugin does"
        );
        drop(p);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while running(child) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!running(child), "{mode:?}: the plugin's child outlived it");
    }
}
