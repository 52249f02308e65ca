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
