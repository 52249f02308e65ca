# cleave_warnings(target): strict warnings for cleave's own code only
# (generated FlatBuffers code and third-party headers are included as SYSTEM).
function(cleave_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor -Wno-unused-parameter>)
    if(CLEAVE_WERROR)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
      if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
        # GCC 12 at -O3 reports false positives inside libstdc++ string code.
        target_compile_options(${target} PRIVATE
          $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=restrict -Wno-error=stringop-overflow -Wno-error=array-bounds>)
      endif()
    endif()
  endif()
endfunction()

# cleave_gcc12_restrict_false_positive(TARGET target FILES files...): GCC 12
# (Debian 12's compiler) warns -Wrestrict inside libstdc++'s
# std::char_traits::copy (bits/char_traits.h:431) for correct std::string code
# at -O2/-O3: `"literal" + std::string(...)`, i.e. operator+(const char*,
# string&&), and assigning a short literal to a string (GCC bugs 105329 and
# 105651). Prefer rewriting the line (append with +=); where that is not an
# option, this silences -Wrestrict for those files of `target` only. Absolute
# paths; a file that no longer exists is ignored (the silence is then stale,
# not harmful).
function(cleave_gcc12_restrict_false_positive)
  cmake_parse_arguments(A "" "TARGET" "FILES" ${ARGN})
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12)
    return()
  endif()
  foreach(f IN LISTS A_FILES)
    if(EXISTS ${f})
      set_property(SOURCE ${f} TARGET_DIRECTORY ${A_TARGET} APPEND PROPERTY COMPILE_OPTIONS -Wno-restrict)
    endif()
  endforeach()
endfunction()
