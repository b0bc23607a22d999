//! The pure compiler of the InstallPlan IR (`compile`, `host`); the IR
//! itself is [`crate::ir`], re-exported here.

pub mod compile;
pub mod host;

pub use crate::ir;
pub use crate::ir::*;
pub use compile::{
    CompileContext, DeployPlanRef, HostContext, PlanError, Target, build_box_plans,
    build_deploy_plan, build_merged_plan, compile_candy_steps, deploy_plan_header,
};
pub use host::{HostMismatch, HostOs, for_host};
