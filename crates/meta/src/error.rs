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
    /// ENOSPC, naming what ran out: the client, the operator and the metrics say
    /// which (a full inode table with gigabytes of data space free looks like a bug
    /// otherwise).
    #[error("ENOSPC: no free {}", .0.name())]
    NoSpace(Resource),
}

/// What a pool ran out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Inode slots of the MDS pool (`df -i`).
    InodeSlots,
    /// Log pages of the MDS pool (names, and entries past an inode's first segment).
    LogPages,
    /// Data pages of the data pools (or of a local file system's data pool).
    DataPages,
    /// Room in the file system under a pool that grows as it is used (tmpfs full).
    PoolSpace,
}

impl Resource {
    pub const ALL: [Resource; 4] = [
        Resource::InodeSlots,
        Resource::LogPages,
        Resource::DataPages,
        Resource::PoolSpace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Resource::InodeSlots => "inode slots",
            Resource::LogPages => "log pages",
            Resource::DataPages => "data pages",
            Resource::PoolSpace => "space for its pool file",
        }
    }

    /// The resource an ENOSPC's message (`FsError::NoSpace`'s, as a reply carries
    /// it) names.
    pub fn named_in(message: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| message.ends_with(r.name()))
    }

    /// The label value in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Resource::InodeSlots => "inode_slots",
            Resource::LogPages => "log_pages",
            Resource::DataPages => "data_pages",
            Resource::PoolSpace => "pool_space",
        }
    }
}

pub const NO_INODE_SLOTS: FsError = FsError::NoSpace(Resource::InodeSlots);
pub const NO_LOG_PAGES: FsError = FsError::NoSpace(Resource::LogPages);
pub const NO_DATA_PAGES: FsError = FsError::NoSpace(Resource::DataPages);

pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    /// Whether the error is a refusal (an errno answer, ENOSPC naming its resource
    /// among them): the operation changed nothing. An I/O error or a damaged pool
    /// says nothing of what happened.
    pub fn is_refusal(&self) -> bool {
        matches!(self, FsError::Errno(_) | FsError::NoSpace(_))
    }

    pub fn errno(&self) -> i32 {
        match self {
            FsError::Errno(e) => *e,
            FsError::NoSpace(_) => libc::ENOSPC,
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
            PoolError::NoRoom { .. } => FsError::NoSpace(Resource::PoolSpace),
            other => FsError::Io(other.to_string()),
        }
    }
}

impl From<FormatError> for FsError {
    fn from(e: FormatError) -> FsError {
        FsError::Corrupt(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_room_under_a_pool_is_an_enospc_naming_it() {
        let e: FsError = PoolError::NoRoom {
            path: "/dev/shm/p".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        }
        .into();
        assert_eq!(e, FsError::NoSpace(Resource::PoolSpace));
        assert!(e.is_refusal() && e.errno() == libc::ENOSPC);
        // Each resource is found again in its message, and in no other's.
        for r in Resource::ALL {
            let m = FsError::NoSpace(r).to_string();
            assert_eq!(Resource::named_in(&m), Some(r), "{m}");
        }
        assert_eq!(Resource::named_in("EIO"), None);
    }
}
