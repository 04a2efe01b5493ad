//! The faults a fake pod injects: named by a request (`x-fake-fault`) or drawn by the pod
//! (`--error-rate` with `--error-fault`); server.rs applies them.

use hyper::StatusCode;

/// A fault a request asks for (`x-fake-fault`) or a pod draws (`--error-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// RST, no response.
    Reset,
    /// No answer for an hour, then RST.
    Hang,
    /// 200 and a partial body, then RST.
    ResetAfterHeaders,
    /// That status at once.
    Status(StatusCode),
}

impl Fault {
    /// The fault `f` names; None for anything else (a request with it is served normally; a
    /// pod's `--error-fault` refuses it).
    pub fn parse(f: &str) -> Option<Fault> {
        match f {
            "reset" => Some(Fault::Reset),
            "hang" => Some(Fault::Hang),
            "reset-after-headers" => Some(Fault::ResetAfterHeaders),
            f => {
                let code = f.strip_prefix("status:")?.trim().parse::<u16>().ok()?;
                StatusCode::from_u16(code).ok().map(Fault::Status)
            }
        }
    }
}
