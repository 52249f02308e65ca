/* test_c_header.c: cleave.h as a C99 app sees it (built with -std=c99 -Wall
   -Wextra -pedantic -Werror): the version agrees with the macros, and misuse
   through null handles returns a status and a message. Exit 0 when all hold. */
#include <stdio.h>
#include <string.h>

#include "cleave/cleave.h"

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (last error: '%s')\n", what, cleave_last_error());
    ++failures;
  }
}

int main(void) {
  char want[32];
  cleave_options* options = NULL;
  cleave_client* client = NULL;
  cleave_client_info info;
  sprintf(want, "%d.%d.%d", CLEAVE_VERSION_MAJOR, CLEAVE_VERSION_MINOR, CLEAVE_VERSION_PATCH);
  expect(strcmp(cleave_version(), want) == 0, "cleave_version() matches CLEAVE_VERSION_MAJOR/MINOR/PATCH");
  expect(strcmp(cleave_version(), CLEAVE_VERSION_STRING) == 0, "cleave_version() matches CLEAVE_VERSION_STRING");

  expect(cleave_options_create(NULL) == CLEAVE_ERR_INVALID_ARGUMENT, "create(NULL)");
  expect(strlen(cleave_last_error()) > 0, "a message after create(NULL)");
  expect(cleave_client_start(NULL) == CLEAVE_ERR_INVALID_ARGUMENT, "start(NULL)");
  expect(cleave_client_get_status(NULL, &info) == CLEAVE_ERR_INVALID_ARGUMENT, "get_status(NULL)");

  expect(cleave_options_create(&options) == CLEAVE_OK && options != NULL, "options_create");
  expect(cleave_client_create(options, &client) == CLEAVE_ERR_INVALID_ARGUMENT && client == NULL,
         "client_create without coordinator or keys");
  expect(strstr(cleave_last_error(), "coordinator") != NULL, "the message names what is missing");
  expect(cleave_options_destroy(options) == CLEAVE_OK, "options_destroy");
  expect(cleave_client_destroy(NULL) == CLEAVE_OK, "client_destroy(NULL)");
  if (failures == 0) printf("cleave %s: C99 header and null-handle checks pass\n", cleave_version());
  return failures == 0 ? 0 : 1;
}
