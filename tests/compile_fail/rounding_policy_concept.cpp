// Must not compile: `int` is not a rounding policy.
#include <scalify/numeric/convert.hpp>

int main()
{
    return scalify::convert<scalify::float8_e4m3fn, int>(1.0f).bits();
}
