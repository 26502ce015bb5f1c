//! One error type for the whole crate; `lib.rs` maps each variant to a Python exception.

use std::fmt;

#[derive(Debug, Clone)]
pub enum Error {
    /// Wrong kind of argument (not a tensor, wrong dtype): Python `TypeError`.
    Type(String),
    /// Wrong value (shape, stride, device mismatch): Python `ValueError`.
    Value(String),
    /// Valid request this build or GPU cannot serve: `flashscan.UnsupportedError`.
    Unsupported(String),
    /// The CUDA backend cannot be used here (no driver, no NVRTC, no GPU).
    Unavailable(String),
    /// NVRTC rejected a kernel; carries the compiler log.
    Compile { what: String, log: String },
    /// A CUDA driver call failed.
    Cuda { call: &'static str, detail: String },
    /// Anything else (I/O on the cache directory is never fatal and does not use this).
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Type(m) | Error::Value(m) | Error::Unsupported(m) | Error::Internal(m) => {
                f.write_str(m)
            }
            Error::Unavailable(m) => write!(f, "CUDA backend unavailable: {m}"),
            Error::Compile { what, log } => write!(f, "NVRTC failed to compile {what}:\n{log}"),
            Error::Cuda { call, detail } => write!(f, "CUDA driver call {call} failed: {detail}"),
        }
    }
}

impl std::error::Error for Error {}

/// Shorthands so checks read as one line each.
pub fn type_err(msg: impl Into<String>) -> Error {
    Error::Type(msg.into())
}
pub fn value_err(msg: impl Into<String>) -> Error {
    Error::Value(msg.into())
}
pub fn unsupported(msg: impl Into<String>) -> Error {
    Error::Unsupported(msg.into())
}
