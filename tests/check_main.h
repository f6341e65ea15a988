// The end of every Check test program: run the suite, exit 1 when a test
// failed.
#pragma once
#include <check.h>

static inline int check_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
