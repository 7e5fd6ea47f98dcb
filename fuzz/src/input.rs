//! Decoding choices from the fuzzer's bytes. Every read succeeds: past the end it yields zeros,
//! so a short input is a valid (simple) call and the fuzzer grows inputs only to reach more.

/// A cursor over the fuzz input.
pub struct Input<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(bytes: &'a [u8]) -> Input<'a> {
        Input { bytes, pos: 0 }
    }

    pub fn byte(&mut self) -> u8 {
        let b = self.bytes.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) | (self.u32() as u64) << 32
    }

    /// `0..n` (`n >= 1`), from one byte.
    pub fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n.max(1)
    }

    /// `lo..=hi`, from one byte.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `k / 256`; a zero byte (an exhausted input) says false.
    pub fn chance(&mut self, k: u8) -> bool {
        self.byte().wrapping_sub(1) < k
    }

    pub fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[self.below(options.len())]
    }

    /// A value for an integer field that a hostile caller might pass: small, boundary or random.
    pub fn hostile_i64(&mut self) -> i64 {
        match self.below(12) {
            0 => -1,
            1 => i64::MIN,
            2 => i64::MAX,
            3 => i32::MAX as i64 + 1,
            4 => 1 << 31,
            5 => 1 << 40,
            6 => (1 << 62) + 1,
            7 => -(self.byte() as i64),
            8 => self.u64() as i64,
            9 => (self.u32() as i32) as i64,
            _ => self.byte() as i64,
        }
    }

    /// A float scalar argument: usually one of `usual`, sometimes a special or random value.
    pub fn scalar(&mut self, usual: &[f32]) -> f32 {
        match self.below(16) {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => f32::from_bits(self.u32()),
            4 => -(self.byte() as f32) / 16.0,
            5 => self.byte() as f32 / 16.0,
            _ => self.pick(usual),
        }
    }
}

/// A small deterministic generator (xorshift64*) for bulk data, seeded from the input so every
/// run of an input is reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
