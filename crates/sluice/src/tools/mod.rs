//! The helpers behind sluice's tools, for programs that want them: none is needed to run a
//! model (that is [`Engine`](crate::Engine) and [`Session`](crate::Session)).
//!
//! - [`doctor`]: what this machine can do for sluice (`sluice doctor`);
//! - [`inspect`]: what a model is and how a budget would be spent on it, without loading it
//!   (`sluice inspect`);
//! - [`pack`]: a checkpoint's trunk packed into one aligned file (`sluice pack`);
//! - [`synth`]: synthetic checkpoints of any shape (`sluice synth`);
//! - [`trace`]: expert request traces, replayed through a policy or Belady's optimum
//!   (`sluice bench`, `--trace`);
//! - [`fmt_bytes`]: a byte count as people read it.

pub mod doctor;
pub mod inspect;
pub mod pack;

pub use sluice_model::plan::fmt_bytes;
pub use sluice_synth as synth;

pub mod trace {
    //! Expert request traces: recorded with
    //! [`EngineBuilder::trace`](crate::EngineBuilder::trace) and
    //! [`Engine::take_trace`](crate::Engine::take_trace), written and read as files, and
    //! replayed through a cache policy ([`simulate`]) or Belady's optimum ([`belady`]).

    pub use sluice_store::{SimResult, TraceEvent, belady, read_trace, simulate, write_trace};
}
