//! Redis: the RESP codec and the Lua scripts the policies run.

pub mod inflight;
pub mod resp;
pub mod scripts;
