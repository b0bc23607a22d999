//! Starting, calling and stopping one plugin process.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::transport::Channel;

use crate::caps::Capabilities;
use crate::error::PluginError;
use crate::executor::{ExecCall, Executor, HostExecutor};
use crate::handshake;
use crate::proto::charly as pb;
use crate::proto::goplugin as gp;
use crate::tls::{Curve, Identity};
use crate::{APP_PROTOCOL_VERSION, HEALTH_SERVICE, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE, net};

/// Where the plugin's output lines go: stderr, stdout after the handshake,
/// and the GRPCStdio stream, each line prefixed with `<plugin name>: `.
pub type LineSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How many stderr lines are kept for error messages.
const STDERR_TAIL: usize = 20;

/// How much of a non-string progress frame is shown.
const FRAME_SHOWN: usize = 1000;

/// What [`Plugin::call`] collected.
struct Called {
    frames: Vec<Vec<u8>>,
}

fn request(
    class: &str,
    word: &str,
    op: &str,
    params: &serde_json::Value,
    env: &serde_json::Value,
) -> pb::InvokeRequest {
    pb::InvokeRequest {
        reserved: word.to_string(),
        op: op.to_string(),
        params_json: json_bytes(params),
        env_json: json_bytes(env),
        class: class.to_string(),
        executor_broker_id: 0,
    }
}

/// Settings of [`Plugin::start`].
#[derive(Clone)]
pub struct PluginOptions {
    /// The name in messages and errors (default: the executable's file name).
    pub name: Option<String>,
    /// How long to wait for the handshake line, the connection and the
    /// health check.
    pub handshake_timeout: Duration,
    /// How long a call may wait for the plugin: `describe` as a whole, and
    /// in `invoke` each stretch in which the plugin neither answers nor calls
    /// the executor (the time the executor itself takes does not count).
    pub call_timeout: Duration,
    /// On drop: how long `GRPCController.Shutdown` and the exit after it may
    /// take before the process is killed.
    pub shutdown_grace: Duration,
    /// Receives the plugin's output lines; `None` drops them (the last stderr
    /// lines still appear in errors).
    pub sink: Option<LineSink>,
    /// Extra environment for the plugin (on top of the inherited one).
    pub env: Vec<(OsString, OsString)>,
    /// go-plugin's `PLUGIN_MIN_PORT`/`PLUGIN_MAX_PORT` for TCP plugins.
    pub port_range: (u16, u16),
    /// go-plugin's AutoMTLS (default on, as the original charly's host
    /// sets it): a fresh client certificate in `PLUGIN_CLIENT_CERT`, and
    /// mutual TLS with a plugin that answers with its own certificate (see
    /// the `tls` module). A plugin that answers without one is spoken to in
    /// plaintext. Off: no `PLUGIN_CLIENT_CERT`, and a plugin that sends a
    /// certificate anyway is [`PluginError::Unsupported`].
    pub auto_mtls: bool,
}

impl Default for PluginOptions {
    fn default() -> Self {
        PluginOptions {
            name: None,
            handshake_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(2),
            sink: None,
            env: Vec::new(),
            // go-plugin's defaults.
            port_range: (10000, 25000),
            auto_mtls: true,
        }
    }
}

impl std::fmt::Debug for PluginOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginOptions")
            .field("name", &self.name)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("sink", &self.sink.as_ref().map(|_| "…"))
            .field("env", &self.env)
            .field("port_range", &self.port_range)
            .field("auto_mtls", &self.auto_mtls)
            .finish()
    }
}

/// A running plugin process, connected.
///
/// The API is blocking: each plugin owns a private tokio runtime, so do not
/// call it (or drop it) from inside an async context. Dropping it asks the
/// plugin to shut down (`GRPCController.Shutdown`), waits
/// [`PluginOptions::shutdown_grace`], then kills and reaps the process.
pub struct Plugin {
    name: String,
    pid: Option<u32>,
    opts: PluginOptions,
    rt: Option<tokio::runtime::Runtime>,
    channel: Channel,
    exit: watch::Receiver<Option<String>>,
    kill: Option<oneshot::Sender<()>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_done: watch::Receiver<bool>,
    broker: mpsc::Sender<gp::ConnInfo>,
    // AutoMTLS: how broker connections are served (None: plaintext).
    tls: Option<Arc<Tls>>,
    next_broker_id: AtomicU32,
    // The plugin answered InvokeStream with UNIMPLEMENTED: use Invoke.
    no_stream: AtomicBool,
    // Holds the broker sockets; removed on drop, after the runtime.
    sockets: tempfile::TempDir,
    // The thread the process was forked from (see `pdeathsig`); ended on
    // drop, after the process was reaped.
    keeper: Keeper,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// What the process-owning task tells: `None` while it runs, then how it ended.
type ExitWatch = watch::Receiver<Option<String>>;

impl Plugin {
    /// Starts `<exe> __plugin serve`, reads and checks its handshake,
    /// connects and checks its health.
    pub fn start(exe: &Path, opts: PluginOptions) -> Result<Plugin, PluginError> {
        let name = opts.name.clone().unwrap_or_else(|| {
            exe.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| exe.display().to_string())
        });
        let setup = |reason: String| PluginError::Setup {
            plugin: name.clone(),
            reason,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("charly-plugin")
            .enable_all()
            .build()
            .map_err(|e| setup(format!("tokio runtime: {e}")))?;
        let sockets = tempfile::Builder::new()
            .prefix("charly-plugin-")
            .tempdir()
            .map_err(|e| setup(format!("socket directory: {e}")))?;
        let identity = if opts.auto_mtls {
            Some(
                Identity::generate(Curve::P256)
                    .map_err(|r| setup(format!("AutoMTLS certificate: {r}")))?,
            )
        } else {
            None
        };
        let cmd = command(exe, &opts, sockets.path(), identity.as_ref());
        let (child, mut keeper) =
            Keeper::spawn(cmd, rt.handle().clone(), &name).map_err(|e| PluginError::Spawn {
                plugin: name.clone(),
                exe: PathBuf::from(exe),
                source: e,
            })?;
        let started = rt.block_on(launch(child, &name, &opts, identity.as_ref()));
        let l = match started {
            Ok(l) => l,
            Err(e) => {
                // launch killed and reaped the child; the runtime's drop
                // cancels the tasks.
                rt.shutdown_timeout(Duration::from_secs(1));
                keeper.finish();
                return Err(e);
            }
        };
        Ok(Plugin {
            name,
            pid: l.pid,
            opts,
            rt: Some(rt),
            channel: l.channel,
            exit: l.exit,
            kill: Some(l.kill),
            stderr: l.stderr,
            stderr_done: l.stderr_done,
            broker: l.broker,
            tls: l.tls,
            next_broker_id: AtomicU32::new(1),
            no_stream: AtomicBool::new(false),
            sockets,
            keeper,
        })
    }

    /// The plugin's name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the connection is mutual TLS (AutoMTLS: the host offered it
    /// and the plugin answered with its certificate).
    pub fn mutual_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The process id (for diagnostics and tests).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        // Present from start until drop.
        self.rt
            .as_ref()
            .unwrap_or_else(|| unreachable!("runtime taken before drop"))
    }

    /// `PluginMeta.Describe`: what the plugin serves.
    pub fn describe(&self) -> Result<Capabilities, PluginError> {
        let op = "describe";
        let mut client = pb::plugin_meta_client::PluginMetaClient::new(self.channel.clone());
        let res = self.rt().block_on(async {
            tokio::time::timeout(self.opts.call_timeout, client.describe(pb::Empty {})).await
        });
        match res {
            Err(_) => Err(self.timeout(op)),
            Ok(Err(status)) => Err(self.rpc_error(op, status)),
            Ok(Ok(r)) => Ok(r.into_inner().into()),
        }
    }

    /// `Provider.Invoke`: runs `op` of `(class, word)` with `params` and `env`
    /// (sent as JSON; `Null` is sent as empty bytes, which plugins read as
    /// "none") and returns the reply's `result_json` parsed (`Null` for an
    /// empty reply). A reply that is not JSON is [`PluginError::BadReply`].
    ///
    /// `&self`: calls from several threads may run at once; each blocks its
    /// own thread.
    ///
    /// With an `executor`, the host serves `ExecutorService` (and
    /// `CheckContextService`) on a fresh broker connection for the duration
    /// of the call and passes its id in `executor_broker_id`; the plugin's
    /// executor calls run `executor` on this thread (see [`Executor`]).
    /// Without one the id is 0. Callback RPCs this host does not implement
    /// (RunHostStep, InvokeProvider, HostBuild, HostArbiter, AddBackground)
    /// answer "not supported".
    pub fn invoke(
        &self,
        class: &str,
        word: &str,
        op: &str,
        params: &serde_json::Value,
        env: &serde_json::Value,
        executor: Option<&mut dyn Executor>,
    ) -> Result<serde_json::Value, PluginError> {
        let what = format!("invoke {class}:{word} {op}");
        let req = request(class, word, op, params, env);
        let call = self.call(&what, req, executor, false).map_err(|(e, _)| e)?;
        // A unary call yields exactly its one reply.
        let bytes = call.frames.into_iter().last().unwrap_or_default();
        self.parse_result(&what, &bytes)
    }

    /// `Provider.InvokeStream`: the streaming form of [`Plugin::invoke`]
    /// (same arguments, executor and errors), which the protocol names for
    /// the genuinely streaming operations (`execute`, `record`, `logcat`).
    ///
    /// The plugin answers a stream of `Frame`s, each carrying `result_json`;
    /// the **last** frame is the call's result (returned parsed like
    /// `invoke`'s reply). Every earlier frame is progress and goes to
    /// [`PluginOptions::sink`] the way the plugin's stderr does, prefixed
    /// `<name>: `: a frame holding a JSON string shows its text (line by
    /// line) as soon as it arrives; any other frame shows as compact JSON
    /// once the next frame proves it was not the last. Every frame must be
    /// JSON ([`PluginError::BadReply`] otherwise), and a stream that ends
    /// without a frame is [`PluginError::BadReply`] too. The timeout applies
    /// to each stretch in which the plugin neither sends a frame nor calls
    /// the executor.
    ///
    /// A plugin that does not serve `InvokeStream` (it answers
    /// `UNIMPLEMENTED` before any frame and before calling the executor,
    /// as go-plugin's and tonic's default stubs do) is asked again with
    /// `Invoke`, and from then on straight away.
    pub fn invoke_stream(
        &self,
        class: &str,
        word: &str,
        op: &str,
        params: &serde_json::Value,
        env: &serde_json::Value,
        executor: Option<&mut dyn Executor>,
    ) -> Result<serde_json::Value, PluginError> {
        let mut executor = executor;
        if !self.no_stream.load(Ordering::Relaxed) {
            let what = format!("invoke-stream {class}:{word} {op}");
            let req = request(class, word, op, params, env);
            match self.call(&what, req, executor.as_deref_mut(), true) {
                Ok(call) => {
                    let Some(last) = call.frames.into_iter().last() else {
                        return Err(PluginError::BadReply {
                            plugin: self.name.clone(),
                            op: what,
                            reason: "the stream ended without a frame".into(),
                            excerpt: String::new(),
                        });
                    };
                    return self.parse_result(&what, &last);
                }
                Err((
                    PluginError::Rpc {
                        code: tonic::Code::Unimplemented,
                        ..
                    },
                    quiet,
                )) if quiet => {
                    self.no_stream.store(true, Ordering::Relaxed);
                }
                Err((e, _)) => return Err(e),
            }
        }
        self.invoke(class, word, op, params, env, executor)
    }

    fn parse_result(&self, what: &str, bytes: &[u8]) -> Result<serde_json::Value, PluginError> {
        if bytes.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(bytes).map_err(|e| PluginError::BadReply {
            plugin: self.name.clone(),
            op: what.to_string(),
            reason: format!("result_json is not JSON: {e}"),
            excerpt: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
        })
    }

    /// Runs one `Invoke` (`stream: false`) or `InvokeStream` call to its
    /// end, serving the executor meanwhile; returns the `result_json` of
    /// every frame (a unary reply is one frame). On failure, also whether
    /// the plugin had done nothing visible yet (no frame, no executor call).
    fn call<'e>(
        &self,
        what: &str,
        mut req: pb::InvokeRequest,
        executor: Option<&mut (dyn Executor + 'e)>,
        stream: bool,
    ) -> Result<Called, (PluginError, bool)> {
        let (calls_tx, mut calls_rx) = mpsc::unbounded_channel::<ExecCall>();
        let mut serving = None;
        if executor.is_some() {
            let id = self.next_broker_id.fetch_add(1, Ordering::Relaxed);
            let (stop, task) = self
                .serve_executor(id, calls_tx, what)
                .map_err(|e| (e, true))?;
            req.executor_broker_id = id;
            serving = Some((stop, task));
        } else {
            drop(calls_tx);
        }
        let (frames_tx, mut frames_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let mut client = pb::provider_client::ProviderClient::new(self.channel.clone());
        let mut call = self.rt().spawn(async move {
            if stream {
                let mut frames = client.invoke_stream(req).await?.into_inner();
                while let Some(f) = frames.message().await? {
                    let _ = frames_tx.send(f.result_json);
                }
            } else {
                let r = client.invoke(req).await?;
                let _ = frames_tx.send(r.into_inner().result_json);
            }
            Ok::<(), tonic::Status>(())
        });
        let mut executor = executor;
        let mut frames: Vec<Vec<u8>> = Vec::new();
        let mut shown = 0; // frames[..shown] went to the sink
        let mut exec_calls = 0usize;
        let outcome = loop {
            enum Step {
                Frame(Vec<u8>),
                Exec(ExecCall),
                Done(Result<Result<(), tonic::Status>, tokio::task::JoinError>),
            }
            let step = self.rt().block_on(async {
                tokio::time::timeout(self.opts.call_timeout, async {
                    tokio::select! {
                        biased;
                        Some(f) = frames_rx.recv() => Step::Frame(f),
                        Some(c) = calls_rx.recv() => Step::Exec(c),
                        r = &mut call => Step::Done(r),
                    }
                })
                .await
            });
            match step {
                Err(_) => {
                    call.abort();
                    break Err(self.timeout(what));
                }
                Ok(Step::Exec(c)) => {
                    exec_calls += 1;
                    match executor.as_deref_mut() {
                        Some(ex) => c.answer(ex),
                        None => drop(c),
                    }
                }
                Ok(Step::Frame(f)) => {
                    if let Err(e) = self.take_frame(what, stream, &mut frames, &mut shown, f) {
                        call.abort();
                        break Err(e);
                    }
                }
                Ok(Step::Done(Err(join))) => {
                    break Err(PluginError::Setup {
                        plugin: self.name.clone(),
                        reason: format!("{what}: call task: {join}"),
                    });
                }
                Ok(Step::Done(Ok(r))) => {
                    // The task has ended: every frame it sent is queued.
                    let mut bad = None;
                    while let Ok(f) = frames_rx.try_recv() {
                        if let Err(e) = self.take_frame(what, stream, &mut frames, &mut shown, f) {
                            bad = Some(e);
                            break;
                        }
                    }
                    if let Some(e) = bad {
                        break Err(e);
                    }
                    break match r {
                        Ok(()) => Ok(()),
                        Err(status) => Err(self.rpc_error(what, status)),
                    };
                }
            }
        };
        if let Some((stop, task)) = serving {
            let _ = stop.send(());
            let _ = self
                .rt()
                .block_on(async { tokio::time::timeout(Duration::from_secs(2), task).await });
        }
        let quiet = frames.is_empty() && exec_calls == 0;
        outcome.map_err(|e| (e, quiet))?;
        Ok(Called { frames })
    }

    /// Takes one frame: checked and, for a stream, the one before it shown
    /// as progress (a JSON string frame is shown at once).
    fn take_frame(
        &self,
        what: &str,
        stream: bool,
        frames: &mut Vec<Vec<u8>>,
        shown: &mut usize,
        f: Vec<u8>,
    ) -> Result<(), PluginError> {
        if !stream {
            frames.push(f);
            return Ok(());
        }
        self.check_frame(what, &f)?;
        // The previous frame was not the last: progress.
        if *shown < frames.len()
            && let Some(prev) = frames.last()
        {
            self.show_frame(prev);
        }
        frames.push(f);
        *shown = frames.len() - 1;
        if matches!(
            frames.last().map(|f| serde_json::from_slice(f)),
            Some(Ok(serde_json::Value::String(_)))
        ) {
            if let Some(last) = frames.last() {
                self.show_frame(last);
            }
            *shown = frames.len();
        }
        Ok(())
    }

    /// Every frame of a stream must be JSON.
    fn check_frame(&self, what: &str, f: &[u8]) -> Result<(), PluginError> {
        if f.is_empty() {
            return Ok(());
        }
        self.parse_result(what, f).map(|_| ())
    }

    /// A progress frame to the sink, as the plugin's stderr lines go.
    fn show_frame(&self, f: &[u8]) {
        let Some(sink) = &self.opts.sink else { return };
        match serde_json::from_slice::<serde_json::Value>(f) {
            Ok(serde_json::Value::String(text)) => {
                for line in text.lines() {
                    sink(&format!("{}: {line}", self.name));
                }
            }
            Ok(v) => {
                let mut text = v.to_string();
                if text.len() > FRAME_SHOWN {
                    let mut end = FRAME_SHOWN;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.truncate(end);
                    text.push('…');
                }
                sink(&format!("{}: {text}", self.name));
            }
            Err(_) => {}
        }
    }

    /// Listens on a fresh socket, serves `ExecutorService` there and announces
    /// it to the plugin's broker under `id`.
    fn serve_executor(
        &self,
        id: u32,
        calls: mpsc::UnboundedSender<ExecCall>,
        what: &str,
    ) -> Result<(oneshot::Sender<()>, tokio::task::JoinHandle<()>), PluginError> {
        let path = self.sockets.path().join(format!("broker-{id}.sock"));
        let broker_err = |reason: String| PluginError::Connect {
            plugin: self.name.clone(),
            op: format!("{what}: broker {id}"),
            reason,
        };
        let listener = {
            // Binding registers with the reactor: needs the runtime's context.
            let _guard = self.rt().enter();
            tokio::net::UnixListener::bind(&path)
                .map_err(|e| broker_err(format!("listen on {}: {e}", path.display())))?
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let svc = pb::executor_service_server::ExecutorServiceServer::new(HostExecutor { calls });
        let cc = pb::check_context_service_server::CheckContextServiceServer::new(
            crate::checkctx::HostCheckContext,
        );
        let tls = self.tls.as_ref().map(|t| t.server.clone());
        let task = self.rt().spawn(async move {
            let stop = async {
                let _ = stop_rx.await;
            };
            let server = tonic::transport::Server::builder()
                .add_service(svc)
                .add_service(cc);
            let _ = match tls {
                None => {
                    server
                        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop)
                        .await
                }
                Some(config) => {
                    server
                        .serve_with_incoming_shutdown(net::tls_incoming(listener, config), stop)
                        .await
                }
            };
        });
        let info = gp::ConnInfo {
            service_id: id,
            network: "unix".into(),
            address: path.to_string_lossy().into_owned(),
            knock: None,
        };
        let broker = self.broker.clone();
        self.rt()
            .block_on(async {
                tokio::time::timeout(self.opts.call_timeout, broker.send(info)).await
            })
            .map_err(|_| broker_err("announcing the connection timed out".into()))?
            .map_err(|_| broker_err("the broker stream is closed".into()))?;
        Ok((stop_tx, task))
    }

    fn timeout(&self, op: &str) -> PluginError {
        PluginError::Timeout {
            plugin: self.name.clone(),
            op: op.to_string(),
            after: self.opts.call_timeout,
        }
    }

    /// A failed RPC: a crash when the process has ended (waiting briefly for
    /// that on transport-like failures), else the plugin's status.
    fn rpc_error(&self, op: &str, status: tonic::Status) -> PluginError {
        let transport = matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Internal
        );
        let wait = if transport {
            Duration::from_secs(2)
        } else {
            Duration::ZERO
        };
        let mut exit = self.exit.clone();
        let mut done = self.stderr_done.clone();
        let ended = self.rt().block_on(async {
            let st = tokio::time::timeout(wait, exit.wait_for(Option::is_some))
                .await
                .ok()
                .and_then(|r| r.ok().and_then(|s| s.clone()));
            if st.is_some() {
                // Let the last stderr lines arrive.
                let _ =
                    tokio::time::timeout(Duration::from_millis(500), done.wait_for(|d| *d)).await;
            }
            st
        });
        match ended {
            Some(status_text) => PluginError::Crashed {
                plugin: self.name.clone(),
                op: op.to_string(),
                status: status_text,
                stderr: tail(&self.stderr),
            },
            None => PluginError::Rpc {
                plugin: self.name.clone(),
                op: op.to_string(),
                code: status.code(),
                message: status.message().to_string(),
            },
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let Some(rt) = self.rt.take() else { return };
        let grace = self.opts.shutdown_grace;
        let mut exit = self.exit.clone();
        let kill = self.kill.take();
        let channel = self.channel.clone();
        rt.block_on(async move {
            if exit.borrow().is_none() {
                let mut ctl = gp::grpc_controller_client::GrpcControllerClient::new(channel);
                let _ = tokio::time::timeout(grace, ctl.shutdown(gp::Empty {})).await;
                let exited = tokio::time::timeout(grace, exit.wait_for(Option::is_some))
                    .await
                    .is_ok();
                if !exited {
                    if let Some(k) = kill {
                        let _ = k.send(());
                    }
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        exit.wait_for(Option::is_some),
                    )
                    .await;
                }
            }
        });
        rt.shutdown_timeout(Duration::from_millis(500));
        // Last: should the process still be there, its parent-death signal
        // ends it now.
        self.keeper.finish();
    }
}

/// The thread a plugin process is forked from. With PR_SET_PDEATHSIG the
/// kernel kills the child when the *thread* that forked it exits, so the
/// fork happens here and this thread then only waits for [`Keeper::finish`]
/// (see [`crate::pdeathsig`]).
struct Keeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Spawns `cmd` from a new keeper thread (inside `rt`'s context, so
    /// tokio's child reaping works) and returns the child.
    fn spawn(
        mut cmd: Command,
        rt: tokio::runtime::Handle,
        name: &str,
    ) -> std::io::Result<(tokio::process::Child, Keeper)> {
        let (child_tx, child_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("plugin-keeper {name}"))
            .spawn(move || {
                let spawned = {
                    let _in_rt = rt.enter();
                    cmd.spawn()
                };
                let ok = spawned.is_ok();
                let _ = child_tx.send(spawned);
                if ok {
                    // Returns when the sender is dropped.
                    let _ = stop_rx.recv();
                }
            })?;
        let mut keeper = Keeper {
            stop: Some(stop),
            thread: Some(thread),
        };
        match child_rx.recv() {
            Ok(Ok(child)) => Ok((child, keeper)),
            Ok(Err(e)) => {
                keeper.finish();
                Err(e)
            }
            Err(_) => {
                keeper.finish();
                Err(std::io::Error::other("the plugin's keeper thread ended"))
            }
        }
    }

    /// Ends the thread (and so, should it still run, the process).
    fn finish(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What [`launch`] sets up.
struct Launched {
    pid: Option<u32>,
    channel: Channel,
    exit: ExitWatch,
    kill: oneshot::Sender<()>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_done: watch::Receiver<bool>,
    broker: mpsc::Sender<gp::ConnInfo>,
    tls: Option<Arc<Tls>>,
}

/// SIGKILLs the process group `pid` leads (a plugin's, see [`command`]).
/// Safe after the leader was reaped: while a member lives the number stays
/// reserved for the group, and with none left the kill finds nothing.
fn stop_group(pid: Option<u32>) {
    let Some(pgid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
}

/// The command that starts the plugin: `<exe> __plugin serve` with
/// go-plugin's environment, dying with charly (see [`crate::pdeathsig`]).
fn command(
    exe: &Path,
    opts: &PluginOptions,
    socket_dir: &Path,
    identity: Option<&Identity>,
) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["__plugin", "serve"])
        .env(MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE)
        .env("PLUGIN_PROTOCOL_VERSIONS", APP_PROTOCOL_VERSION.to_string())
        .env("PLUGIN_MIN_PORT", opts.port_range.0.to_string())
        .env("PLUGIN_MAX_PORT", opts.port_range.1.to_string())
        .env("PLUGIN_UNIX_SOCKET_DIR", socket_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // A group of its own: whatever the plugin starts (a shell plugin's
        // commands) is stopped with it (see `stop_group`).
        .process_group(0);
    match identity {
        Some(id) => cmd.env("PLUGIN_CLIENT_CERT", &id.pem),
        // Without AutoMTLS a plugin must not find a client cert (an
        // inherited one would make a go-plugin plugin expect TLS).
        None => cmd.env_remove("PLUGIN_CLIENT_CERT"),
    };
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    crate::pdeathsig::die_with_parent(&mut cmd);
    cmd
}

async fn launch(
    mut child: tokio::process::Child,
    name: &str,
    opts: &PluginOptions,
    identity: Option<&Identity>,
) -> Result<Launched, PluginError> {
    let pid = child.id();
    let sink = opts.sink.clone();
    let prefix = format!("{name}: ");

    // stderr: to the sink, and the last lines kept for errors.
    let (stderr_tail, stderr_done) = read_stderr(&mut child, sink.clone(), prefix.clone());

    // stdout: the first line is the handshake, the rest goes to the sink.
    let first_rx = read_stdout(&mut child, sink.clone(), prefix.clone());

    // The process: one task owns it, reports its end, kills it on request.
    let (exit, kill) = own_process(child, pid);

    // On any failure from here on: kill the process and wait until it is
    // reaped, so a failed start leaves nothing behind.
    let reap = exit.clone();
    let fail = async |e: PluginError, kill: oneshot::Sender<()>| {
        let _ = kill.send(());
        let mut reap = reap.clone();
        let _ = tokio::time::timeout(Duration::from_secs(5), reap.wait_for(Option::is_some)).await;
        e
    };
    let line = match tokio::time::timeout(opts.handshake_timeout, first_rx).await {
        Ok(Ok(line)) => line,
        Ok(Err(_)) => {
            // stdout closed without a line: most likely the process ended.
            let mut exit2 = exit.clone();
            let st = tokio::time::timeout(Duration::from_secs(2), exit2.wait_for(Option::is_some))
                .await
                .ok()
                .and_then(|r| r.ok().and_then(|s| s.clone()));
            let mut done = stderr_done.clone();
            let _ = tokio::time::timeout(Duration::from_millis(500), done.wait_for(|d| *d)).await;
            let e = match st {
                Some(status) => PluginError::ExitedBeforeHandshake {
                    plugin: name.to_string(),
                    status,
                    stderr: tail(&stderr_tail),
                },
                None => PluginError::BadHandshake {
                    plugin: name.to_string(),
                    line: String::new(),
                    reason: "closed stdout without a handshake line".into(),
                },
            };
            return Err(fail(e, kill).await);
        }
        Err(_) => {
            let e = PluginError::HandshakeTimeout {
                plugin: name.to_string(),
                after: opts.handshake_timeout,
                stderr: tail(&stderr_tail),
            };
            return Err(fail(e, kill).await);
        }
    };
    let hs = match handshake::parse(&line) {
        Ok(h) => h,
        Err(reason) => {
            let e = PluginError::BadHandshake {
                plugin: name.to_string(),
                line,
                reason,
            };
            return Err(fail(e, kill).await);
        }
    };
    let tls = match (&hs.cert, identity) {
        (None, _) => None,
        (Some(_), None) => {
            let e = PluginError::Unsupported {
                plugin: name.to_string(),
                what: "a server certificate (AutoMTLS) when the host did not offer AutoMTLS".into(),
            };
            return Err(fail(e, kill).await);
        }
        (Some(field), Some(id)) => match Tls::new(id, field) {
            Ok(t) => Some(Arc::new(t)),
            Err(reason) => {
                let e = PluginError::BadCertificate {
                    plugin: name.to_string(),
                    reason,
                };
                return Err(fail(e, kill).await);
            }
        },
    };
    let channel = match net::connect(
        &hs.addr,
        opts.handshake_timeout,
        tls.as_ref().map(|t| t.client.clone()),
    )
    .await
    {
        Ok(c) => c,
        Err(reason) => {
            let e = PluginError::Connect {
                plugin: name.to_string(),
                op: format!(
                    "connect to {}{}",
                    hs.addr,
                    if tls.is_some() { " (mutual TLS)" } else { "" }
                ),
                reason,
            };
            return Err(fail(e, kill).await);
        }
    };
    if let Err(reason) = check_health(channel.clone(), opts.handshake_timeout).await {
        let e = PluginError::Connect {
            plugin: name.to_string(),
            op: "health check".into(),
            reason,
        };
        return Err(fail(e, kill).await);
    }

    let broker = start_broker(channel.clone());

    relay_stdio(channel.clone(), sink, prefix);

    Ok(Launched {
        pid,
        channel,
        exit,
        kill,
        stderr: stderr_tail,
        stderr_done,
        broker,
        tls,
    })
}

/// Reads the plugin's stderr into the sink, keeping its last lines for
/// errors; the flag turns true once it is read to its end.
fn read_stderr(
    child: &mut tokio::process::Child,
    sink: Option<LineSink>,
    prefix: String,
) -> (Arc<Mutex<VecDeque<String>>>, watch::Receiver<bool>) {
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    let (stderr_done_tx, stderr_done) = watch::channel(false);
    if let Some(err) = child.stderr.take() {
        let keep = Arc::clone(&stderr_tail);
        tokio::spawn(async move {
            for_each_line(err, |line| {
                if let Ok(mut k) = keep.lock() {
                    if k.len() == STDERR_TAIL {
                        k.pop_front();
                    }
                    k.push_back(line.to_string());
                }
                if let Some(s) = &sink {
                    s(&format!("{prefix}{line}"));
                }
            })
            .await;
            let _ = stderr_done_tx.send(true);
        });
    } else {
        let _ = stderr_done_tx.send(true);
    }
    (stderr_tail, stderr_done)
}

/// Reads the plugin's stdout: its first line (the handshake) comes back
/// on the channel, the rest goes to the sink.
fn read_stdout(
    child: &mut tokio::process::Child,
    sink: Option<LineSink>,
    prefix: String,
) -> oneshot::Receiver<String> {
    let (first_tx, first_rx) = oneshot::channel::<String>();
    if let Some(out) = child.stdout.take() {
        tokio::spawn(async move {
            let mut first = Some(first_tx);
            for_each_line(out, |line| {
                if let Some(tx) = first.take() {
                    let _ = tx.send(line.to_string());
                } else if let Some(s) = &sink {
                    s(&format!("{prefix}{line}"));
                }
            })
            .await;
        });
    }
    first_rx
}

/// One task owns the plugin's process: it reports its end (the exit
/// status, as text) and kills it, with its process group, on request.
fn own_process(
    mut child: tokio::process::Child,
    pid: Option<u32>,
) -> (watch::Receiver<Option<String>>, oneshot::Sender<()>) {
    let (exit_tx, exit) = watch::channel(None::<String>);
    let (kill, kill_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let st = tokio::select! {
            st = child.wait() => st,
            _ = kill_rx => {
                stop_group(pid);
                let _ = child.start_kill();
                child.wait().await
            }
        };
        // What it left running (children of a plugin that exited, or was
        // killed, before them) goes too.
        stop_group(pid);
        let text = match st {
            Ok(s) => s.to_string(),
            Err(e) => format!("wait failed: {e}"),
        };
        let _ = exit_tx.send(Some(text));
    });
    (exit, kill)
}

/// go-plugin's broker: the host keeps one StartStream open; it announces
/// its own endpoints on it. What the plugin announces is not used.
fn start_broker(channel: Channel) -> mpsc::Sender<gp::ConnInfo> {
    let (broker, broker_rx) = mpsc::channel::<gp::ConnInfo>(16);
    let mut broker_client = gp::grpc_broker_client::GrpcBrokerClient::new(channel);
    tokio::spawn(async move {
        if let Ok(resp) = broker_client
            .start_stream(ReceiverStream::new(broker_rx))
            .await
        {
            let mut inbound = resp.into_inner();
            while let Some(Ok(_)) = inbound.next().await {}
        }
    });
    broker
}

/// go-plugin's GRPCStdio: the plugin's captured stdout/stderr, if it has
/// it, line by line to the sink. Read even without a sink: a Go plugin's
/// writes block once nobody drains the stream.
fn relay_stdio(channel: Channel, sink: Option<LineSink>, prefix: String) {
    {
        let emit = move |line: &str| {
            if let Some(s) = &sink {
                s(&format!("{prefix}{line}"));
            }
        };
        let mut stdio = gp::grpc_stdio_client::GrpcStdioClient::new(channel);
        tokio::spawn(async move {
            let Ok(resp) = stdio.stream_stdio(()).await else {
                return;
            };
            let mut s = resp.into_inner();
            let mut partial: [Vec<u8>; 3] = Default::default();
            while let Some(Ok(d)) = s.next().await {
                let ch = usize::try_from(d.channel).unwrap_or(0).min(2);
                partial[ch].extend_from_slice(&d.data);
                while let Some(pos) = partial[ch].iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = partial[ch].drain(..=pos).collect();
                    let text = String::from_utf8_lossy(&line);
                    emit(text.trim_end_matches(['\n', '\r']));
                }
            }
            for rest in partial.iter().filter(|p| !p.is_empty()) {
                emit(&String::from_utf8_lossy(rest));
            }
        });
    }
}

/// AutoMTLS with one plugin: how the host dials it and serves it broker
/// connections.
struct Tls {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
}

impl Tls {
    /// From the host's identity and the handshake's certificate field.
    fn new(me: &Identity, field: &str) -> Result<Tls, String> {
        let peer = crate::tls::parse_handshake_cert(field)?;
        let key = me.certified_key()?;
        Ok(Tls {
            client: Arc::new(crate::tls::client_config(&key, &peer)?),
            server: Arc::new(crate::tls::server_config(&key, &peer)?),
        })
    }
}

async fn check_health(channel: Channel, timeout: Duration) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut c = tonic_health::pb::health_client::HealthClient::new(channel);
    let req = tonic_health::pb::HealthCheckRequest {
        service: HEALTH_SERVICE.to_string(),
    };
    match tokio::time::timeout(timeout, c.check(req)).await {
        Err(_) => Err(format!("no answer within {timeout:?}")),
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Ok(Ok(r)) => {
            let st = r.into_inner().status;
            if st == ServingStatus::Serving as i32 {
                Ok(())
            } else {
                Err(format!(
                    "service {HEALTH_SERVICE:?} is {:?}, not SERVING",
                    ServingStatus::try_from(st).unwrap_or(ServingStatus::Unknown)
                ))
            }
        }
    }
}

/// Calls `f` with each line (lossy UTF-8, without the line end) until EOF.
async fn for_each_line(r: impl AsyncRead + Unpin, mut f: impl FnMut(&str)) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let s = String::from_utf8_lossy(&buf);
                f(s.trim_end_matches(['\n', '\r']));
            }
        }
    }
}

fn tail(lines: &Mutex<VecDeque<String>>) -> String {
    lines
        .lock()
        .map(|l| l.iter().cloned().collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

fn json_bytes(v: &serde_json::Value) -> Vec<u8> {
    if v.is_null() {
        Vec::new()
    } else {
        // A Value always serializes.
        serde_json::to_vec(v).unwrap_or_default()
    }
}
