//! The InstallPlan IR (`ir`) and its pure compiler (`compile`).

pub mod compile;
pub mod host;
pub mod ir;

pub use compile::{
    CompileContext, DeployPlanRef, HostContext, PlanError, Target, build_box_plans,
    build_deploy_plan, build_merged_plan, compile_candy_steps, deploy_plan_header,
};
pub use host::{HostMismatch, HostOs, for_host};
pub use ir::*;
