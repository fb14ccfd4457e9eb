//! Floats written as Python's `repr` writes them, for messages that quote a value the
//! way PyTorch's f-strings do (`-1.0`, `nan`, `1e-08`, `inf`).

use std::fmt;

/// Displays an `f64` exactly as Python's `repr(float)` (and so an f-string) does: the
/// shortest digits that round-trip, a `.0` on integral values, scientific notation
/// below `1e-4` and from `1e16` on with a sign and at least two exponent digits, and
/// `nan` / `inf` / `-inf`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PyFloat(pub f64);

impl fmt::Display for PyFloat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            return f.write_str("nan");
        }
        if v.is_infinite() {
            return f.write_str(if v > 0.0 { "inf" } else { "-inf" });
        }
        // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7", "1e16".
        let sci = format!("{:e}", v.abs());
        let (mantissa, exp) = sci.split_once('e').expect("`{:e}` writes an exponent");
        let exp: i32 = exp.parse().expect("`{:e}` writes an integer exponent");
        let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
        let sign = if v.is_sign_negative() { "-" } else { "" };
        // Python's rule (float_repr_style 'short', repr mode 'r'): with the value as
        // 0.DIGITS * 10^decpt, fixed notation when -4 < decpt <= 16.
        let decpt = exp + 1;
        if decpt > -4 && decpt <= 16 {
            let n = digits.len() as i32;
            let body = if decpt <= 0 {
                format!("0.{}{}", "0".repeat((-decpt) as usize), digits)
            } else if decpt >= n {
                format!("{}{}.0", digits, "0".repeat((decpt - n) as usize))
            } else {
                let (int, frac) = digits.split_at(decpt as usize);
                format!("{int}.{frac}")
            };
            write!(f, "{sign}{body}")
        } else {
            let esign = if exp < 0 { '-' } else { '+' };
            write!(f, "{sign}{mantissa}e{esign}{:02}", exp.abs())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PyFloat;

    #[test]
    fn as_python_repr_writes_them() {
        // Each right-hand side is what CPython 3 prints for `repr(x)`.
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (-1.0, "-1.0"),
            (-0.1, "-0.1"),
            (0.001, "0.001"),
            (1e-4, "0.0001"),
            (1.5e-4, "0.00015"),
            (1e-5, "1e-05"),
            (1e-8, "1e-08"),
            (-2.5e-8, "-2.5e-08"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::NAN, "nan"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for &(v, want) in cases {
            assert_eq!(PyFloat(v).to_string(), want, "{v:e}");
        }
    }
}
