//! The InstallPlan IR (`ir`) and its pure compiler (`compile`).

pub mod compile;
pub mod host;
pub mod ir;

pub use compile::{
    HostContext, PlanError, Target, build_box_plans, build_deploy_plan, build_merged_plan,
};
pub use host::{HostMismatch, HostOs, for_host};
pub use ir::*;
