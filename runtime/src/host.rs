//! Owned host bytes aligned for any tensor element type.

use zerocopy::IntoBytes;

/// Bytes on the host held in 8-byte words, so that a tensor of any type stored in them is
/// aligned for its element type.
#[derive(Clone, Debug, Default)]
pub struct HostBytes {
    words: Vec<u64>,
    len: usize,
}

impl HostBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        HostBytes {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> Self {
        let mut h = HostBytes::zeroed(bytes.len());
        h.as_mut_bytes().copy_from_slice(bytes);
        h
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.words.as_bytes()[..self.len]
    }

    /// The bytes, to write.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut self.words.as_mut_bytes()[..self.len]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
