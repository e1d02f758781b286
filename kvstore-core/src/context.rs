//! Device contexts, as MXNet's `Context` (`cpu(i)`, `gpu(i)`).

use std::fmt;

/// The kind of device a [`Context`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceType {
    /// Host memory. CPU ids are logical devices, as MXNet's `cpu(i)`.
    Cpu,
    /// A GPU, served by a registered GPU backend (`kvstore-cuda`).
    Gpu,
}

/// Where an array lives: `cpu(id)` or `gpu(id)`. The default is `cpu(0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Context {
    device_type: DeviceType,
    device_id: u32,
}

impl Context {
    /// The logical CPU device `id`. Every CPU context is host memory.
    pub const fn cpu(id: u32) -> Self {
        Context { device_type: DeviceType::Cpu, device_id: id }
    }

    /// The GPU `id`.
    pub const fn gpu(id: u32) -> Self {
        Context { device_type: DeviceType::Gpu, device_id: id }
    }

    /// The kind of device.
    pub const fn device_type(self) -> DeviceType {
        self.device_type
    }

    /// The device number.
    pub const fn device_id(self) -> u32 {
        self.device_id
    }

    /// Whether the array memory of this context is host memory.
    pub const fn is_cpu(self) -> bool {
        matches!(self.device_type, DeviceType::Cpu)
    }
}

impl Default for Context {
    fn default() -> Self {
        Context::cpu(0)
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.device_type {
            DeviceType::Cpu => "cpu",
            DeviceType::Gpu => "gpu",
        };
        write!(f, "{name}({})", self.device_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_context_is_cpu_zero_and_prints_like_mxnet() {
        assert_eq!(Context::default(), Context::cpu(0));
        assert_eq!(Context::gpu(3).to_string(), "gpu(3)");
        assert!(Context::cpu(2).is_cpu());
        assert!(!Context::gpu(0).is_cpu());
    }
}
