//! charly-plugin-example: the Rust mirror of the original's reference step
//! plugin `candy/plugin-example-stepkind` (step `examplestepkind`).
//!
//! - `emit` (build): `{"fragment": "RUN … > /etc/examplestepkind-build-baked\n"}`.
//! - `execute` (deploy): dials the host's executor over the broker, writes
//!   `/tmp/charly-examplestepkind/marker` with RunUser, and answers a
//!   `DeployReply` whose one reverse op removes the marker directory.
//!
//! AutoMTLS: when the host asks, it serves mutual TLS with an ECDSA P-256
//! certificate; `CHARLY_PLUGIN_EXAMPLE_TLS=p384` makes it P-384, `=off`
//! makes it a plugin without AutoMTLS (plaintext, 5 handshake fields).
//!
//! It serves both `Invoke` and `InvokeStream`. Streamed, `execute` sends
//! two progress frames before its reply: a JSON string before it writes
//! the marker (`"examplestepkind: writing the marker"`) and an object after
//! (`{"examplestepkind": "marker written"}`); every other op streams its
//! reply as the one frame.

use std::process::ExitCode;

use charly_plugin::proto::charly as pb;
use charly_plugin::reply::{
    DeployReply, DeployReplyRecord, EmitReply, OP_EMIT, OP_EXECUTE, ReverseOp, shell_quote,
};
use charly_plugin::{Capabilities, ProvidedCapability, StepContract, StepVenue};
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

const CALVER: &str = "2026.182.0900";
const CANDY: &str = "plugin-example-stepkind";
const MARKER_DIR: &str = "/tmp/charly-examplestepkind";
const BUILD_MARKER_PATH: &str = "/etc/examplestepkind-build-baked";
const SCHEMA_CUE: &str = "#ExamplestepkindInput: {\n\tmarker?: string\n}\n";

#[derive(serde::Deserialize, Default)]
struct StepInput {
    #[serde(default)]
    marker: String,
}

struct Provider;

fn reply<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, Status> {
    serde_json::to_vec(v).map_err(|e| Status::internal(e.to_string()))
}

/// Where streamed progress frames go (`None` for a unary `Invoke`).
type Progress = Option<mpsc::Sender<Result<pb::Frame, Status>>>;

async fn progress(to: &Progress, v: serde_json::Value) {
    if let Some(tx) = to {
        let _ = tx
            .send(Ok(pb::Frame {
                result_json: v.to_string().into_bytes(),
            }))
            .await;
    }
}

type FrameStream = Pin<Box<dyn Stream<Item = Result<pb::Frame, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::provider_server::Provider for Provider {
    async fn invoke(
        &self,
        req: Request<pb::InvokeRequest>,
    ) -> Result<Response<pb::InvokeReply>, Status> {
        let result_json = run(req.into_inner(), None).await?;
        Ok(Response::new(pb::InvokeReply { result_json }))
    }

    async fn invoke_stream(
        &self,
        req: Request<pb::InvokeRequest>,
    ) -> Result<Response<FrameStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let req = req.into_inner();
        tokio::spawn(async move {
            let last = run(req, Some(tx.clone()))
                .await
                .map(|result_json| pb::Frame { result_json });
            let _ = tx.send(last).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One call: the reply's `result_json`.
async fn run(req: pb::InvokeRequest, frames: Progress) -> Result<Vec<u8>, Status> {
    let input: StepInput = if req.params_json.is_empty() {
        StepInput::default()
    } else {
        serde_json::from_slice(&req.params_json)
            .map_err(|e| Status::invalid_argument(format!("{CANDY}: decode payload: {e}")))?
    };
    match req.op.as_str() {
        OP_EMIT => {
            let marker = if input.marker.is_empty() {
                "EXAMPLE-STEPKIND-BUILD-BAKED".to_string()
            } else {
                input.marker
            };
            let fragment = format!(
                "RUN mkdir -p /etc && printf '%s\\n' {} > {BUILD_MARKER_PATH}\n",
                shell_quote(&marker)
            );
            reply(&EmitReply { fragment })
        }
        OP_EXECUTE => {
            let mut exec = charly_plugin::serve::dial_executor(req.executor_broker_id)
                .await
                .map_err(|e| Status::failed_precondition(format!("{CANDY}: {e}")))?;
            let marker = if input.marker.is_empty() {
                "EXAMPLE-STEPKIND-OK".to_string()
            } else {
                input.marker
            };
            let script = format!(
                "mkdir -p {MARKER_DIR} && printf '%s\\n' {} > {MARKER_DIR}/marker",
                shell_quote(&marker)
            );
            progress(
                &frames,
                serde_json::json!("examplestepkind: writing the marker"),
            )
            .await;
            let r = exec
                .run_user(pb::RunRequest {
                    script,
                    opts_json: Vec::new(),
                })
                .await?
                .into_inner();
            if !r.error.is_empty() {
                return Err(Status::aborted(format!(
                    "{CANDY}: write marker: {}",
                    r.error
                )));
            }
            progress(
                &frames,
                serde_json::json!({"examplestepkind": "marker written"}),
            )
            .await;
            reply(&DeployReply {
                reverse_ops: vec![ReverseOp::plugin_script(
                    "user",
                    &format!("rm -rf {MARKER_DIR}"),
                )],
                record: DeployReplyRecord {
                    candy: CANDY.into(),
                    version: CALVER.into(),
                },
            })
        }
        _ => Ok(b"{}".to_vec()),
    }
}

struct Meta;

#[tonic::async_trait]
impl pb::plugin_meta_server::PluginMeta for Meta {
    async fn describe(&self, _: Request<pb::Empty>) -> Result<Response<pb::Capabilities>, Status> {
        let caps = Capabilities {
            calver: CALVER.into(),
            protocol_version: charly_plugin::APP_PROTOCOL_VERSION,
            provided: vec![ProvidedCapability {
                class: "step".into(),
                word: "examplestepkind".into(),
                input_def: "#ExamplestepkindInput".into(),
                step_contract: Some(StepContract {
                    scope: "user".into(),
                    venue: StepVenue::HostNative,
                    gate: String::new(),
                    emits: true,
                }),
                structural: false,
                lifecycle: false,
                preresolve: false,
                validates: false,
                phase: String::new(),
            }],
            schema_cue: SCHEMA_CUE.into(),
        };
        Ok(Response::new(caps.into()))
    }
}

fn main() -> ExitCode {
    use charly_plugin::serve::{Curve, ServeOptions, ServeTls};
    let tls = match std::env::var("CHARLY_PLUGIN_EXAMPLE_TLS").as_deref() {
        Ok("off") => ServeTls::Off,
        Ok("p384") => ServeTls::Auto(Curve::P384),
        Ok("p256") | Ok("") | Err(_) => ServeTls::Auto(Curve::P256),
        Ok(other) => {
            eprintln!("CHARLY_PLUGIN_EXAMPLE_TLS={other:?}: expected off, p256 or p384");
            return ExitCode::from(2);
        }
    };
    charly_plugin::serve::serve_with(
        Provider,
        Meta,
        ServeOptions {
            tls,
            ..ServeOptions::default()
        },
    )
}
