//! The host's venue, served back to a plugin as `ExecutorService` during an
//! `invoke` (go-plugin's broker carries the connection).
//!
//! Design: [`Executor`] methods take `&mut self` and need not be `Send` (the
//! deploy crate's `Host` seam is neither shared nor `Send`). The gRPC handlers
//! run on the plugin's private tokio runtime and only forward each call over a
//! channel to the thread that called [`crate::Plugin::invoke`]; that thread
//! runs the executor and sends the answer back. So calls reach the executor
//! one at a time, on the caller's thread, while the invoke is in flight.

use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::proto::charly as pb;

/// A failure of an executor operation; its text goes back to the plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExecError(pub String);

/// What [`Executor::run_capture`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capture {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Exit code (non-zero is not an error).
    pub exit_code: i32,
}

/// The venue a plugin drives during an invoke (the wire's `ExecutorService`).
/// `opts_json` is the original's `EmitOpts` as JSON (may be empty); it is
/// passed through as is.
pub trait Executor {
    /// A short description of the venue (`local`, `ssh root@host`).
    fn venue(&mut self) -> Result<String, ExecError>;
    /// Runs a shell script as root. A non-zero exit is an error.
    fn run_system(&mut self, script: &str, opts_json: &[u8]) -> Result<(), ExecError>;
    /// Runs a shell script as the deploy user. A non-zero exit is an error.
    fn run_user(&mut self, script: &str, opts_json: &[u8]) -> Result<(), ExecError>;
    /// Runs a shell script (no root escalation) and captures its output; a
    /// non-zero exit is an `Ok` capture, only failing to run is an error.
    fn run_capture(&mut self, script: &str, opts_json: &[u8]) -> Result<Capture, ExecError>;
    /// Places `content` at `path` with `mode`; owned by root when `owner_root`.
    fn put_file(
        &mut self,
        path: &str,
        content: &[u8],
        mode: u32,
        owner_root: bool,
        opts_json: &[u8],
    ) -> Result<(), ExecError>;
    /// Reads a venue file (as root when `as_root`).
    fn get_file(
        &mut self,
        path: &str,
        as_root: bool,
        opts_json: &[u8],
    ) -> Result<Vec<u8>, ExecError>;
}

/// One executor call crossing from a gRPC handler to the invoking thread.
pub(crate) enum ExecCall {
    Venue(oneshot::Sender<Result<String, ExecError>>),
    RunSystem(pb::RunRequest, oneshot::Sender<Result<(), ExecError>>),
    RunUser(pb::RunRequest, oneshot::Sender<Result<(), ExecError>>),
    RunCapture(pb::RunRequest, oneshot::Sender<Result<Capture, ExecError>>),
    PutFile(pb::PutFileRequest, oneshot::Sender<Result<(), ExecError>>),
    GetFile(
        pb::GetFileRequest,
        oneshot::Sender<Result<Vec<u8>, ExecError>>,
    ),
}

impl ExecCall {
    /// Runs the call on `ex` and sends the answer back (a gone handler is fine).
    pub(crate) fn answer(self, ex: &mut dyn Executor) {
        match self {
            ExecCall::Venue(tx) => {
                let _ = tx.send(ex.venue());
            }
            ExecCall::RunSystem(r, tx) => {
                let _ = tx.send(ex.run_system(&r.script, &r.opts_json));
            }
            ExecCall::RunUser(r, tx) => {
                let _ = tx.send(ex.run_user(&r.script, &r.opts_json));
            }
            ExecCall::RunCapture(r, tx) => {
                let _ = tx.send(ex.run_capture(&r.script, &r.opts_json));
            }
            ExecCall::PutFile(r, tx) => {
                let _ =
                    tx.send(ex.put_file(&r.path, &r.content, r.mode, r.owner_root, &r.opts_json));
            }
            ExecCall::GetFile(r, tx) => {
                let _ = tx.send(ex.get_file(&r.path, r.as_root, &r.opts_json));
            }
        }
    }
}

/// The `ExecutorService` the host serves on a broker connection.
pub(crate) struct HostExecutor {
    pub(crate) calls: mpsc::UnboundedSender<ExecCall>,
}

impl HostExecutor {
    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, ExecError>>) -> ExecCall,
    ) -> Result<Result<T, ExecError>, Status> {
        let (tx, rx) = oneshot::channel();
        self.calls
            .send(make(tx))
            .map_err(|_| Status::unavailable("the host's invoke has ended"))?;
        rx.await
            .map_err(|_| Status::unavailable("the host's invoke has ended"))
    }
}

fn err_text<T>(r: &Result<T, ExecError>) -> String {
    r.as_ref().err().map(|e| e.0.clone()).unwrap_or_default()
}

const NOT_SUPPORTED: &str = "not supported by this host (charly)";

#[tonic::async_trait]
impl pb::executor_service_server::ExecutorService for HostExecutor {
    async fn venue(&self, _: Request<pb::Empty>) -> Result<Response<pb::VenueReply>, Status> {
        match self.call(ExecCall::Venue).await? {
            Ok(venue) => Ok(Response::new(pb::VenueReply { venue })),
            Err(e) => Err(Status::internal(e.0)),
        }
    }

    async fn run_system(
        &self,
        req: Request<pb::RunRequest>,
    ) -> Result<Response<pb::RunReply>, Status> {
        let r = self
            .call(|tx| ExecCall::RunSystem(req.into_inner(), tx))
            .await?;
        Ok(Response::new(pb::RunReply {
            error: err_text(&r),
        }))
    }

    async fn run_user(
        &self,
        req: Request<pb::RunRequest>,
    ) -> Result<Response<pb::RunReply>, Status> {
        let r = self
            .call(|tx| ExecCall::RunUser(req.into_inner(), tx))
            .await?;
        Ok(Response::new(pb::RunReply {
            error: err_text(&r),
        }))
    }

    async fn put_file(
        &self,
        req: Request<pb::PutFileRequest>,
    ) -> Result<Response<pb::PutFileReply>, Status> {
        let r = self
            .call(|tx| ExecCall::PutFile(req.into_inner(), tx))
            .await?;
        Ok(Response::new(pb::PutFileReply {
            error: err_text(&r),
        }))
    }

    async fn run_capture(
        &self,
        req: Request<pb::RunRequest>,
    ) -> Result<Response<pb::CaptureReply>, Status> {
        let r = self
            .call(|tx| ExecCall::RunCapture(req.into_inner(), tx))
            .await?;
        Ok(Response::new(match r {
            Ok(c) => pb::CaptureReply {
                stdout: c.stdout,
                stderr: c.stderr,
                exit_code: c.exit_code,
                error: String::new(),
            },
            Err(e) => pb::CaptureReply {
                error: e.0,
                ..Default::default()
            },
        }))
    }

    async fn get_file(
        &self,
        req: Request<pb::GetFileRequest>,
    ) -> Result<Response<pb::GetFileReply>, Status> {
        let r = self
            .call(|tx| ExecCall::GetFile(req.into_inner(), tx))
            .await?;
        Ok(Response::new(match r {
            Ok(content) => pb::GetFileReply {
                content,
                error: String::new(),
            },
            Err(e) => pb::GetFileReply {
                content: Vec::new(),
                error: e.0,
            },
        }))
    }

    async fn run_host_step(
        &self,
        _: Request<pb::HostStepRequest>,
    ) -> Result<Response<pb::HostStepReply>, Status> {
        Ok(Response::new(pb::HostStepReply {
            reverse_ops_json: Vec::new(),
            error: format!("RunHostStep is {NOT_SUPPORTED}"),
        }))
    }

    async fn invoke_provider(
        &self,
        _: Request<pb::InvokeProviderRequest>,
    ) -> Result<Response<pb::InvokeReply>, Status> {
        // InvokeReply has no error field: the error rides the status.
        Err(Status::unimplemented(format!(
            "InvokeProvider is {NOT_SUPPORTED}"
        )))
    }

    async fn host_build(
        &self,
        _: Request<pb::HostBuildRequest>,
    ) -> Result<Response<pb::HostBuildReply>, Status> {
        Ok(Response::new(pb::HostBuildReply {
            result_json: Vec::new(),
            error: format!("HostBuild is {NOT_SUPPORTED}"),
        }))
    }

    async fn host_arbiter(
        &self,
        _: Request<pb::HostArbiterRequest>,
    ) -> Result<Response<pb::HostArbiterReply>, Status> {
        Ok(Response::new(pb::HostArbiterReply {
            result_json: Vec::new(),
            error: format!("HostArbiter is {NOT_SUPPORTED}"),
        }))
    }
}
