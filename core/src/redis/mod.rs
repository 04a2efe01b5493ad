//! Redis: the RESP codec and the Lua scripts the policies run.

pub mod bind;
pub mod inflight;
pub mod resp;
pub mod scripts;
pub mod waiters;
