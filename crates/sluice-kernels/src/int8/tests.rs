use super::*;
use crate::gguf::dequantize_block;
use crate::{Isa, Kernels, Numerics};

/// A deterministic stream of bytes (xorshift), for random blocks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    /// A float in [−scale, scale).
    fn f(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

const FORMATS: [BlockFormat; 11] = [
    BlockFormat::IQ4_NL,
    BlockFormat::MXFP4,
    BlockFormat::IQ4_XS,
    BlockFormat::Q8_0,
    BlockFormat::Q4_0,
    BlockFormat::Q4_1,
    BlockFormat::Q5_0,
    BlockFormat::Q5_1,
    BlockFormat::Q4_K,
    BlockFormat::Q5_K,
    BlockFormat::Q6_K,
];

/// Random blocks of `f` with finite scales (the f16 scales set to values in [2^-12, 2^-4]),
/// `n` of them; with `extreme`, every code and scale at its largest magnitude.
fn blocks(f: BlockFormat, n: usize, rng: &mut Rng, extreme: bool) -> Vec<u8> {
    let ts = f.type_size();
    let mut b: Vec<u8> = (0..n * ts)
        .map(|_| if extreme { 0xff } else { rng.byte() })
        .collect();
    let scale = |rng: &mut Rng| -> [u8; 2] {
        let v = if extreme {
            half::f16::MAX.to_f32() / 4.0
        } else {
            (1.0 + rng.f(0.5)) * 2f32.powi(-((rng.next() % 9) as i32) - 4)
        };
        half::f16::from_f32(v).to_le_bytes()
    };
    for blk in b.chunks_exact_mut(ts) {
        let at: &[usize] = match f {
            BlockFormat::Q8_0 | BlockFormat::Q4_0 | BlockFormat::Q5_0 => &[0],
            BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4_K | BlockFormat::Q5_K => {
                &[0, 2]
            }
            BlockFormat::Q6_K => &[208],
            BlockFormat::IQ4_NL | BlockFormat::IQ4_XS => &[0],
            // E8M0: any byte is a scale.
            BlockFormat::MXFP4 => &[],
            _ => unreachable!(),
        };
        for &a in at {
            blk[a..a + 2].copy_from_slice(&scale(rng));
        }
        if f == BlockFormat::MXFP4 {
            // An E8M0 scale of 2^(e − 128) around 1 (or the extreme case's 2^12).
            blk[0] = if extreme {
                140
            } else {
                118 + (rng.next() % 16) as u8
            };
        }
        if extreme && f == BlockFormat::Q8_0 {
            // −128 codes.
            blk[2..].fill(0x80);
        }
        if extreme && f == BlockFormat::Q6_K {
            // Scales of −128 and the codes' largest magnitude, −32.
            blk[192..208].fill(0x80);
            blk[..192].fill(0);
        }
    }
    b
}

fn acts(cols: usize, rows: usize, rng: &mut Rng, extreme: bool) -> Vec<f32> {
    (0..cols * rows)
        .map(|j| {
            if extreme {
                // Every block's largest value repeated with both signs: ±127 codes.
                if j % 2 == 0 { 3.0 } else { -3.0 }
            } else {
                rng.f(2.0)
            }
        })
        .collect()
}

#[test]
fn q8_k_quantizes_as_llama_cpp() {
    let mut x = vec![0f32; 256];
    x[..4].copy_from_slice(&[1.0, -2.0, 0.5, 2.0]);
    let q = quantize(ActKind::Q8_K, &x, 256);
    // The first value of largest magnitude is −2: iscale = −127 / −2 = 63.5; 63.5 rounds to
    // even (64), 31.75 to 32, −2 to −127 and the later +2 to 127.
    assert_eq!(&q.codes(0)[..4], &[64, -127, 32, 127]);
    assert_eq!(q.scales(0)[0], 1.0 / 63.5);
    assert_eq!(q.bsums(0)[0], 64 - 127 + 32 + 127);
    // 62.5 rounds to even too (62), where rounding half away from zero would give 63.
    let mut y = vec![0f32; 256];
    y[0] = 127.0;
    y[1] = 62.5;
    assert_eq!(
        &quantize(ActKind::Q8_K, &y, 256).codes(0)[..2],
        &[-127, -62]
    );
    // A block of zeros.
    let z = quantize(ActKind::Q8_K, &[0.0; 256], 256);
    assert_eq!(z.scales(0)[0], 0.0);
    assert!(z.codes(0).iter().all(|&c| c == 0));
}

#[test]
fn q8_0_and_q8_1_quantize_as_llama_cpp() {
    let mut x = vec![0f32; 32];
    x[..3].copy_from_slice(&[1.0, -2.0, 0.5]);
    let q = quantize(ActKind::Q8_0, &x, 32);
    // d = 2/127, id = 63.5: 63.5 rounds away from zero (64), 31.75 to 32.
    assert_eq!(&q.codes(0)[..3], &[64, -127, 32]);
    assert_eq!(q.scales(0)[0], half::f16::from_f32(2.0 / 127.0).to_f32());
    let q1 = quantize(ActKind::Q8_1, &x, 32);
    assert_eq!(q1.codes(0), q.codes(0));
    let s = (64 - 127 + 32) as f32 * (2.0f32 / 127.0);
    assert_eq!(q1.sums(0)[0], half::f16::from_f32(s).to_f32());
}

#[test]
fn rows_quantize_alone() {
    let mut rng = Rng(7);
    let x = acts(512, 3, &mut rng, false);
    for kind in [ActKind::Q8_0, ActKind::Q8_1, ActKind::Q8_K] {
        let all = quantize(kind, &x, 512);
        for i in 0..3 {
            let one = quantize(kind, &x[i * 512..(i + 1) * 512], 512);
            assert_eq!(all.codes(i), one.codes(0), "{kind:?}");
            assert_eq!(all.scales(i), one.scales(0), "{kind:?}");
        }
    }
}

/// The integer product is the product of the dequantized weights with the dequantized
/// activations, up to f32 rounding: the codes, their order and the scales are read as the
/// format's decoder reads them.
#[test]
fn the_integer_product_is_the_dequantized_product() {
    let mut rng = Rng(99);
    for f in FORMATS {
        let kind = ActKind::for_format(f).unwrap();
        let cols = 512;
        let nb = cols / f.block_size();
        for _ in 0..20 {
            let row = blocks(f, nb, &mut rng, false);
            let x = acts(cols, 1, &mut rng, false);
            let a = quantize(kind, &x, cols);
            let got = dot(f, &row, &a, 0);
            let mut w = vec![0f32; cols];
            for (blk, out) in row
                .chunks_exact(f.type_size())
                .zip(w.chunks_exact_mut(f.block_size()))
            {
                dequantize_block(f, blk, out);
            }
            let ab = kind.block();
            let (mut want, mut mag) = (0f64, 0f64);
            for (j, &wj) in w.iter().enumerate() {
                let aj = a.codes(0)[j] as f64 * a.scales(0)[j / ab] as f64;
                want += wj as f64 * aj;
                mag += (wj as f64 * aj).abs();
            }
            // Q8_1's `s` is the f16 of d × Σ q: a min's term carries its rounding.
            let tol = if kind == ActKind::Q8_1 { 2e-3 } else { 1e-5 };
            assert!(
                (got as f64 - want).abs() <= tol * mag + 1e-6,
                "{f:?}: {got} against {want} (magnitude {mag})"
            );
        }
    }
}

/// Every ISA's integer product gives the specification's bits, on random and extreme blocks,
/// for 1 to 5 activation rows and any row range.
#[test]
fn every_isa_gives_the_specifications_bits() {
    let mut rng = Rng(1234);
    for f in FORMATS {
        let kind = ActKind::for_format(f).unwrap();
        // 800 and 1056: a last run of fewer than eight 32-blocks.
        for (extreme, cols) in [(false, 768), (true, 768), (false, 800), (true, 1056)] {
            let (rows, cols) = (13, cols / f.block_size() * f.block_size());
            let data = blocks(f, rows * cols / f.block_size(), &mut rng, extreme);
            let m = Matrix::dense(Codes::Block(f), &data, rows, cols).unwrap();
            for batch in 1..=5 {
                let x = acts(cols, batch, &mut rng, extreme);
                let a = quantize(kind, &x, cols);
                let mut want = vec![0f32; batch * rows];
                matmul(&m, &a, &mut want, 0..rows);
                for isa in Isa::available() {
                    let k = Kernels::new(isa).unwrap().with_numerics(Numerics::Int8);
                    for range in [0..rows, 3..11] {
                        let mut got = vec![0f32; batch * range.len()];
                        k.matmul(&m, &x, &mut got, range.clone());
                        for i in 0..batch {
                            for (r, g) in range.clone().zip(&got[i * range.len()..]) {
                                assert_eq!(
                                    g.to_bits(),
                                    want[i * rows + r].to_bits(),
                                    "{f:?} {isa} extreme {extreme} batch {batch} row {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
