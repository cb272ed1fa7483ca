//! Deterministic float sums: each double as a 128-bit fixed-point term on a
//! scale set by its group's largest magnitude, and the sum back to a double.


#[cfg(any(test, feature = "test-support"))]
/// Bits of a double's exponent field.
pub(super) const EXPONENT_BITS: u64 = 0x7ff;
#[cfg(any(test, feature = "test-support"))]
/// The bits of a double's significand below its implicit bit.
pub(super) const SIGNIFICAND_MASK: u64 = (1 << 52) - 1;

#[cfg(any(test, feature = "test-support"))]
/// The exponent field of a finite double with bits `bits`, or the
/// special-value flag it raises: NaN 1, +inf 2, -inf 4
/// ([`Reduction::SumF64Fixed`], pass 1 in `ptx/group_by.cu`).
pub fn fixed_point_scale(bits: u64) -> Result<u64, u64> {
    let exponent = (bits >> 52) & EXPONENT_BITS;
    if exponent != EXPONENT_BITS {
        Ok(exponent)
    } else if bits & SIGNIFICAND_MASK != 0 {
        Err(1)
    } else if bits >> 63 == 1 {
        Err(4)
    } else {
        Err(2)
    }
}

#[cfg(any(test, feature = "test-support"))]
/// The finite double with bits `bits` as an integer in units of
/// 2^(`top` - 1084), truncated toward zero, where `top` is the largest
/// exponent field of its group (at least the value's own): the group's
/// largest values take 62 bits ([`Reduction::SumF64Fixed`], pass 2 in
/// `ptx/group_by.cu`).
pub fn fixed_point_term(bits: u64, top: u64) -> i128 {
    let mut exponent = (bits >> 52) & EXPONENT_BITS;
    let mut significand = bits & SIGNIFICAND_MASK;
    if exponent == 0 {
        exponent = 1;
    } else {
        significand |= 1 << 52;
    }
    let top = top.max(1);
    let drop = top.saturating_sub(exponent);
    let magnitude = if drop <= 9 {
        significand << (9 - drop)
    } else if drop - 9 < 64 {
        significand >> (drop - 9)
    } else {
        0
    };
    if bits >> 63 == 1 {
        -i128::from(magnitude)
    } else {
        i128::from(magnitude)
    }
}

/// The double of a fixed-point sum (`sum` in units of 2^(`top` - 1084)),
/// or of the special values its group saw: NaN, or +inf and -inf together,
/// give NaN; one infinity gives itself.
pub fn fixed_sum_to_f64(sum: i128, top: u64, specials: u64) -> f64 {
    if specials & 1 != 0 || specials & 6 == 6 {
        return f64::NAN;
    }
    if specials & 2 != 0 {
        return f64::INFINITY;
    }
    if specials & 4 != 0 {
        return f64::NEG_INFINITY;
    }
    // One rounding to a double, then exact scaling (but in the subnormal
    // range): the same bits however the terms were added.
    let mut value = sum as f64;
    let mut power = top.max(1) as i32 - 1084;
    let step = |p: i32| f64::from_bits(((p + 1023) as u64) << 52);
    while power > 1000 {
        value *= step(1000);
        power -= 1000;
    }
    while power < -1000 {
        value *= step(-1000);
        power += 1000;
    }
    value * step(power)
}
