//! Errors of file-system operations: a POSIX errno, or damage found on the media.

use orion_format::FormatError;
use orion_pmem::PoolError;

/// What an operation returns on failure. `errno()` gives the code Linux would return.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    #[error("{}", errno_name(*.0))]
    Errno(i32),
    /// The media holds something that cannot be (a checksum mismatch, a bad pointer).
    #[error("pool damaged: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Io(String),
}

pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Errno(e) => *e,
            FsError::Corrupt(_) | FsError::Io(_) => libc::EIO,
        }
    }
}

pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSPC => "ENOSPC",
        libc::EINVAL => "EINVAL",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::EMLINK => "EMLINK",
        libc::EFBIG => "EFBIG",
        libc::EIO => "EIO",
        libc::ELOOP => "ELOOP",
        libc::EBUSY => "EBUSY",
        libc::ESTALE => "ESTALE",
        libc::EBADF => "EBADF",
        libc::EXDEV => "EXDEV",
        libc::ENODATA => "ENODATA",
        libc::ERANGE => "ERANGE",
        libc::E2BIG => "E2BIG",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAGAIN => "EAGAIN",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

macro_rules! errnos {
    ($($name:ident),*) => {
        $(pub const $name: FsError = FsError::Errno(libc::$name);)*
    };
}
errnos!(
    ENOENT,
    EEXIST,
    ENOTEMPTY,
    ENOTDIR,
    EISDIR,
    ENAMETOOLONG,
    ENOSPC,
    EINVAL,
    EPERM,
    EMLINK,
    EFBIG,
    EBUSY,
    ESTALE,
    EBADF,
    EACCES,
    ELOOP,
    EXDEV,
    ENODATA,
    ERANGE,
    E2BIG,
    EOPNOTSUPP
);

impl From<PoolError> for FsError {
    fn from(e: PoolError) -> FsError {
        match e {
            PoolError::OutOfBounds { .. } | PoolError::Misaligned(_) => {
                FsError::Corrupt(e.to_string())
            }
            other => FsError::Io(other.to_string()),
        }
    }
}

impl From<FormatError> for FsError {
    fn from(e: FormatError) -> FsError {
        FsError::Corrupt(e.to_string())
    }
}
