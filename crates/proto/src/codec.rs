//! Little-endian writer and a bounds-checked reader for message bodies.

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("message truncated while reading {0}")]
    Truncated(&'static str),
    #[error("bad magic {0:#06x}: not an OrionFS message")]
    BadMagic(u16),
    #[error("protocol version {0} (this build speaks {v})", v = crate::VERSION)]
    BadVersion(u8),
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("invalid {0}")]
    Invalid(&'static str),
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    /// Bytes with a u32 length in front.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        // A prefix that truncated the length would misframe every field after it.
        debug_assert!(
            u32::try_from(v.len()).is_ok(),
            "{} bytes overflow their length prefix",
            v.len()
        );
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
        self
    }
    pub fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            Some(x) => self.u8(1).u64(x),
            None => self.u8(0),
        }
    }
    pub fn opt_u32(&mut self, v: Option<u32>) -> &mut Self {
        match v {
            Some(x) => self.u8(1).u32(x),
            None => self.u8(0),
        }
    }
}

/// Reads fields in order; every read checks the remaining length.
pub struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, at: 0 }
    }

    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(ProtoError::Truncated(what))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub fn i32(&mut self, what: &'static str) -> Result<i32, ProtoError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub fn i64(&mut self, what: &'static str) -> Result<i64, ProtoError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    pub fn bool(&mut self, what: &'static str) -> Result<bool, ProtoError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::Invalid(what)),
        }
    }
    /// Length-prefixed bytes, at most `max` long.
    pub fn bytes(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(ProtoError::Invalid(what));
        }
        self.take(n, what)
    }
    pub fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, ProtoError> {
        Ok(if self.bool(what)? {
            Some(self.u64(what)?)
        } else {
            None
        })
    }
    pub fn opt_u32(&mut self, what: &'static str) -> Result<Option<u32>, ProtoError> {
        Ok(if self.bool(what)? {
            Some(self.u32(what)?)
        } else {
            None
        })
    }
    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<(), ProtoError> {
        match self.b.len() - self.at {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
    pub fn rest(&self) -> &'a [u8] {
        &self.b[self.at..]
    }
}
