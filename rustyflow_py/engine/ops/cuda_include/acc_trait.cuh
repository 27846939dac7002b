// The acc of an ElementwiseKernel's T: float, or double for double (CuPy names its 16-bit
// types itself, so they take the default).
template <typename T> struct rf_acc { typedef float type; };
template <> struct rf_acc<double> { typedef double type; };
