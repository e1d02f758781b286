//! Row-sparse arrays (MXNet's `row_sparse` storage): the stored rows of a logical
//! array `[rows, ...]` as one dense block, with their row indices, sorted. What an
//! embedding's gradient is: only the rows a batch touched.

use crate::dtype::{DType, Element, with_dtype};
use crate::error::{Error, Result};
use crate::ndarray::NDArray;

/// A row-sparse array: of logical shape `shape` (`[rows, ...]`), whose rows
/// `indices` (strictly increasing, each below `shape[0]`) are `data` (of shape
/// `[indices.len(), shape[1..]...]`), every other row zero.
///
/// ```
/// use kvstore_core::{NDArray, RowSparse};
/// let g = RowSparse::new(NDArray::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?, vec![0, 3], &[4, 2])?;
/// assert_eq!(g.to_dense()?.to_vec::<f32>()?, vec![1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0]);
/// let back = RowSparse::from_dense(&g.to_dense()?)?;
/// assert_eq!(back.indices(), &[0, 3]);
/// # Ok::<(), kvstore_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct RowSparse {
    shape: Vec<usize>,
    indices: Vec<i64>,
    data: NDArray,
}

impl RowSparse {
    /// The row-sparse array of logical shape `shape` whose rows `indices` are `data`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `shape` has no dimension, the indices are not
    /// strictly increasing or not below `shape[0]`, or `data` is not of shape
    /// `[indices.len(), shape[1..]...]`.
    pub fn new(data: NDArray, indices: Vec<i64>, shape: &[usize]) -> Result<Self> {
        if let Some(&rows) = shape.first() {
            check_rows(&indices, rows, "the indices of a row-sparse array")?;
        }
        Self::of_checked_rows(data, indices, shape)
    }

    /// [`RowSparse::new`] of `indices` already known to be strictly increasing rows of
    /// `shape` (the store's own: a `row_sparse_pull`'s, sorted as they were checked).
    pub(crate) fn of_checked_rows(data: NDArray, indices: Vec<i64>, shape: &[usize]) -> Result<Self> {
        let Some((&rows, rest)) = shape.split_first() else {
            return Err(Error::invalid_argument("a row-sparse array needs at least one dimension (its rows)"));
        };
        debug_assert!(check_rows(&indices, rows, "checked rows").is_ok());
        let want: Vec<usize> = std::iter::once(indices.len()).chain(rest.iter().copied()).collect();
        if data.shape() != want.as_slice() {
            return Err(Error::invalid_argument(format!(
                "the data of a row-sparse array of shape {shape:?} with {} rows stored must have shape {want:?}, not {:?}",
                indices.len(),
                data.shape()
            )));
        }
        Ok(RowSparse { shape: shape.to_vec(), indices, data })
    }

    /// No rows stored: all zeros, of `shape` and `dtype`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `shape` has no dimension.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Self> {
        let rest = shape.get(1..).unwrap_or_default();
        let data = NDArray::zeros_with(&[&[0][..], rest].concat(), dtype, crate::Context::cpu(0))?;
        RowSparse::new(data, Vec::new(), shape)
    }

    /// The rows of `dense` that hold a non-zero element (MXNet's `tostype('row_sparse')`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an array with no dimension.
    pub fn from_dense(dense: &NDArray) -> Result<Self> {
        let shape = dense.shape().to_vec();
        if shape.is_empty() {
            return Err(Error::invalid_argument("a row-sparse array needs at least one dimension (its rows)"));
        }
        let row_len = row_len(&shape);
        let (indices, data) = with_dtype!(dense.dtype(), T => dense.with_data(|d: &[T]| {
            let mut indices = Vec::new();
            let mut data: Vec<T> = Vec::new();
            for (r, row) in d.chunks(row_len.max(1)).enumerate().take(shape[0]) {
                if row_len > 0 && row.iter().any(|x| *x != T::default()) {
                    indices.push(r as i64);
                    data.extend_from_slice(row);
                }
            }
            let data = NDArray::from_vec(&[&[indices.len()][..], &shape[1..]].concat(), data);
            (indices, data)
        })?);
        RowSparse::new(data?, indices, &shape)
    }

    /// The dense array: the stored rows, zeros elsewhere.
    ///
    /// # Errors
    /// As [`NDArray::zeros_with`].
    pub fn to_dense(&self) -> Result<NDArray> {
        let out = NDArray::zeros_with(&self.shape, self.dtype(), crate::Context::cpu(0))?;
        self.assign_to(&out)?;
        Ok(out)
    }

    /// Makes `dense` (of this logical shape and dtype) this array: its rows, zeros
    /// elsewhere.
    pub(crate) fn assign_to(&self, dense: &NDArray) -> Result<()> {
        let rl = self.row_len();
        with_dtype!(self.dtype(), T => self.data.with_data(|src: &[T]| {
            dense.with_data_mut(|dst: &mut [T]| {
                dst.fill(T::default());
                for (i, &r) in self.indices.iter().enumerate() {
                    let r = r as usize;
                    dst[r * rl..(r + 1) * rl].copy_from_slice(&src[i * rl..(i + 1) * rl]);
                }
            })
        })?)
    }

    /// The logical shape, `[rows, ...]`.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The stored rows' indices, strictly increasing.
    pub fn indices(&self) -> &[i64] {
        &self.indices
    }

    /// The stored rows, `[indices.len(), shape[1..]...]`.
    pub fn data(&self) -> &NDArray {
        &self.data
    }

    /// The elements of one row.
    pub fn row_len(&self) -> usize {
        row_len(&self.shape)
    }

    /// The sum of `values` (all of `shape` and `dtype`, checked by the caller), to be
    /// read only (one value is returned as it is, sharing its data), row by
    /// row over the union of their rows, each row's values added left to right in the
    /// accumulator of `T` and rounded once (as dense sums are).
    pub(crate) fn sum(values: &[&RowSparse]) -> Result<RowSparse> {
        let first = values.first().ok_or_else(|| Error::invalid_argument("a row-sparse sum of no values"))?;
        if let [one] = values {
            // Read only (the caller's call holds the value): no copy.
            return Ok((*one).clone());
        }
        let mut union: Vec<i64> = values.iter().flat_map(|v| v.indices.iter().copied()).collect();
        union.sort_unstable();
        union.dedup();
        let rl = first.row_len();
        let shape = first.shape.clone();
        let data_shape = [&[union.len()][..], &shape[1..]].concat();
        let data = with_dtype!(first.dtype(), T => sum_rows::<T>(values, &union, rl, &data_shape))?;
        Ok(RowSparse { shape, indices: union, data })
    }
}

/// `values`' rows summed over `union` (see [`RowSparse::sum`]).
fn sum_rows<T: Element>(values: &[&RowSparse], union: &[i64], rl: usize, data_shape: &[usize]) -> Result<NDArray> {
    let mut acc = vec![T::Acc::default(); union.len() * rl];
    let mut seen = vec![false; union.len()];
    for v in values {
        v.data.with_data(|d: &[T]| {
            // Both index lists are sorted: walk them together.
            let mut u = 0;
            for (i, &r) in v.indices.iter().enumerate() {
                while union[u] != r {
                    u += 1;
                }
                let (dst, src) = (&mut acc[u * rl..(u + 1) * rl], &d[i * rl..(i + 1) * rl]);
                if seen[u] {
                    dst.iter_mut().zip(src).for_each(|(a, x)| *a = T::acc_add(*a, x.to_acc()));
                } else {
                    dst.iter_mut().zip(src).for_each(|(a, x)| *a = x.to_acc());
                    seen[u] = true;
                }
            }
        })?;
    }
    NDArray::from_vec(data_shape, acc.into_iter().map(T::from_acc).collect())
}

/// The elements of one row of an array of `shape`.
pub(crate) fn row_len(shape: &[usize]) -> usize {
    shape.iter().skip(1).product()
}

/// Checks that `ids` are strictly increasing and each in `0..rows`, for `what`.
pub(crate) fn check_rows(ids: &[i64], rows: usize, what: &str) -> Result<()> {
    if let Some(&bad) = ids.iter().find(|&&r| r < 0 || r as u64 >= rows as u64) {
        return Err(Error::invalid_argument(format!("{what}: row {bad} is out of range for {rows} rows")));
    }
    if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
        return Err(Error::invalid_argument(format!(
            "{what} must be strictly increasing (sorted, no row twice): {} comes before {}",
            w[0], w[1]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rsp(rows: &[i64], data: &[f32], shape: &[usize]) -> RowSparse {
        let d = NDArray::from_vec(&[rows.len(), shape[1]], data.to_vec()).unwrap();
        RowSparse::new(d, rows.to_vec(), shape).unwrap()
    }

    #[test]
    fn sums_run_over_the_union_of_rows_left_to_right() {
        let a = rsp(&[0], &[1.0, 1.0], &[3, 2]);
        let b = rsp(&[0, 2], &[2.0, 2.0, 3.0, 3.0], &[3, 2]);
        let s = RowSparse::sum(&[&a, &b]).unwrap();
        assert_eq!(s.indices(), &[0, 2]);
        assert_eq!(s.to_dense().unwrap().to_vec::<f32>().unwrap(), vec![3.0, 3.0, 0.0, 0.0, 3.0, 3.0]);
        // f32 order: 1e8 + 4 + 4 vs 4 + 4 + 1e8.
        let big = rsp(&[1], &[1e8, 0.0], &[3, 2]);
        let four = rsp(&[1], &[4.0, 0.0], &[3, 2]);
        let s = RowSparse::sum(&[&big, &four, &four]).unwrap();
        assert_eq!(s.data().to_vec::<f32>().unwrap()[0], 1e8);
        let s = RowSparse::sum(&[&four, &four, &big]).unwrap();
        assert_eq!(s.data().to_vec::<f32>().unwrap()[0], 100000008.0);
    }

    #[test]
    fn bad_indices_and_data_are_clear_errors() {
        let d = NDArray::zeros(&[2, 2]).unwrap();
        for (rows, want) in [
            (vec![1, 0], "strictly increasing"),
            (vec![1, 1], "strictly increasing"),
            (vec![0, 4], "out of range"),
            (vec![-1, 0], "out of range"),
        ] {
            let e = RowSparse::new(d.clone(), rows, &[4, 2]).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
        let e = RowSparse::new(d, vec![0], &[4, 2]).unwrap_err();
        assert!(e.to_string().contains("must have shape [1, 2]"), "{e}");
        assert!(RowSparse::zeros(&[], DType::F32).is_err());
    }

    #[test]
    fn dense_round_trips_keep_the_non_zero_rows() {
        let dense = NDArray::from_vec(&[3, 2], vec![0.0f32, 0.0, 0.0, -0.5, 0.0, 0.0]).unwrap();
        let r = RowSparse::from_dense(&dense).unwrap();
        assert_eq!(r.indices(), &[1]);
        assert_eq!(r.to_dense().unwrap().to_vec::<f32>().unwrap(), dense.to_vec::<f32>().unwrap());
        let z = RowSparse::zeros(&[5, 3], DType::F64).unwrap();
        assert_eq!((z.indices().len(), z.data().shape()), (0, &[0, 3][..]));
        assert_eq!(z.to_dense().unwrap().to_vec::<f64>().unwrap(), vec![0.0; 15]);
    }
}
