// The entry point of the layering checks (shared/CMakeLists.txt): each links one module's every
// object against only the modules it may use; the link, not this program, is the check.
int main() { return 0; }
